"""CIFAR-10 and CIFAR-100 from their "python version" pickles in a local folder, never downloaded.

--data-dir is the extracted folder itself or the folder holding it:
  cifar10   cifar-10-batches-py/  data_batch_1 … data_batch_5 (training set, in that order), test_batch
  cifar100  cifar-100-python/     train, test (the 100 fine labels)
Each pickle is a dict with b"data" (uint8 [n, 3072], channel-major 3x32x32) and b"labels" or
b"fine_labels". The held-out split is the test file, None if it is absent. Unpickling admits only the
numpy array constructors these files use, so a stray pickle cannot run code.

Exercised by: `pytest tests/unit/test_data.py -k cifar`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from commprof.base.errors import UsageError
from commprof.data.images import ImageArrays


@dataclass(frozen=True)
class CifarLayout:
    """Where one CIFAR variant keeps its files and labels."""

    title: str
    """Name in messages."""
    folder: str
    """The folder the archive extracts to."""
    train: tuple[str, ...]
    """Training files, concatenated in this order."""
    test: str
    """Held-out file."""
    label_key: bytes
    """Key of the labels in each pickle."""
    num_classes: int
    """Number of classes."""
    mean: tuple[float, float, float]
    """Per-channel mean of the training set, pixel values in [0, 1]."""
    std: tuple[float, float, float]
    """Per-channel std of the training set."""


LAYOUTS = {
    "cifar10": CifarLayout("CIFAR-10", "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
                           "test_batch", b"labels", 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": CifarLayout("CIFAR-100", "cifar-100-python", ("train",), "test", b"fine_labels", 100,
                            (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class _ArraysOnly(pickle.Unpickler):
    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module.removeprefix("numpy.core.")  # numpy 2 renamed it
        return super().find_class(module, name)


def _read_batch(path: Path, layout: CifarLayout, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        with path.open("rb") as f:
            d = _ArraysOnly(f, encoding="bytes").load()
    except Exception as e:  # a corrupt pickle can fail in many ways; all mean the same to the user
        raise UsageError(f"{name}: cannot read {path}: {e}") from None
    data = d.get(b"data") if isinstance(d, dict) else None
    labels = d.get(layout.label_key) if isinstance(d, dict) else None
    if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2
            or data.shape[1] != 3072 or labels is None or len(labels) != len(data)):
        raise UsageError(f"{name}: {path} is not a {layout.title} python batch (expected a dict of uint8 "
                         f"b'data' [n, 3072] and n {layout.label_key!r})")
    labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < layout.num_classes:
        raise UsageError(f"{name}: {path} holds labels outside 0-{layout.num_classes - 1}")
    return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), labels


def open_cifar(name: str, data_dir: str, *, in_channels: int | None, image_size: int | None,
               num_samples: int | None) -> ImageArrays:
    """The training set (the first `num_samples` images if given) with the test file as held-out split."""
    layout = LAYOUTS[name]
    root = Path(data_dir).expanduser()
    folder = root if (root / layout.train[0]).is_file() else root / layout.folder
    parts = []
    for file in layout.train:
        if not (folder / file).is_file():
            raise UsageError(f"{name}: {folder / file} not found; put the {layout.title} python version "
                             f"({layout.folder}/) in --data-dir")
        parts.append(_read_batch(folder / file, layout, name))
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    if num_samples is not None:
        if not 0 < num_samples <= len(images):
            raise UsageError(f"{name}: asked for {num_samples} samples; the training set has {len(images)}")
        images, labels = images[:num_samples], labels[:num_samples]
    common = dict(name=name, num_classes=layout.num_classes, mean=layout.mean, std=layout.std,
                  in_channels=in_channels, image_size=image_size)
    heldout = None
    if (folder / layout.test).is_file():
        test_images, test_labels = _read_batch(folder / layout.test, layout, name)
        heldout = ImageArrays(images=test_images, labels=test_labels, **common)
    return ImageArrays(images=images, labels=labels, heldout=heldout, **common)
