"""MNIST from the four IDX files in a local folder (plain or .gz), never downloaded.

Looked for in --data-dir itself, then in --data-dir/MNIST/raw/ (where torchvision keeps them):
train-images-idx3-ubyte, train-labels-idx1-ubyte (training set), t10k-images-idx3-ubyte,
t10k-labels-idx1-ubyte (held-out split; optional). Pixels are normalised with MNIST's mean 0.1307 and
std 0.3081; other sizes are resized, see `commprof.data.images`.

Exercised by: `pytest tests/unit/test_data.py -k mnist`.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from commprof.base.errors import UsageError
from commprof.data.images import ImageArrays

MEAN, STD = (0.1307,), (0.3081,)
# IDX magic numbers: type 0x08 (unsigned byte) and the number of dimensions, 3 for images, 1 for labels.
_IMAGES, _LABELS = 0x0803, 0x0801


def _find(data_dir: Path, name: str) -> Path | None:
    for folder in (data_dir, data_dir / "MNIST" / "raw"):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _missing(data_dir: Path, name: str) -> UsageError:
    return UsageError(f"mnist: {data_dir / name}(.gz) not found; put the MNIST IDX files in --data-dir "
                      f"(or in its MNIST/raw/)")


def read_idx(path: Path, *, magic: int) -> np.ndarray:
    """The uint8 array in an IDX file, after checking its magic number and that its size matches."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise UsageError(f"mnist: cannot read {path}: {e}") from None
    dims = magic & 0xFF
    what = "images" if magic == _IMAGES else "labels"
    if len(raw) < 4 + 4 * dims or int.from_bytes(raw[:4], "big") != magic:
        got = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise UsageError(f"mnist: {path} is not an IDX {what} file (magic number {got}, expected {magic})")
    shape = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
    body = raw[4 + 4 * dims:]
    if len(body) != int(np.prod(shape)):
        raise UsageError(f"mnist: {path} is corrupt: its header says {'x'.join(map(str, shape))} "
                         f"({int(np.prod(shape))} bytes) but it holds {len(body)} bytes")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def _read_split(data_dir: Path, prefix: str, *, required: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    names = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
    paths = [_find(data_dir, n) for n in names]
    if not required and paths == [None, None]:
        return None
    for name, path in zip(names, paths):
        if path is None:
            raise _missing(data_dir, name)
    images = read_idx(paths[0], magic=_IMAGES)
    labels = read_idx(paths[1], magic=_LABELS)
    if len(images) != len(labels):
        raise UsageError(f"mnist: {paths[0]} holds {len(images)} images but {paths[1]} "
                         f"{len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise UsageError(f"mnist: {paths[1]} holds label {labels.max()}; MNIST labels are 0-9")
    return torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def open_mnist(data_dir: str, *, in_channels: int | None, image_size: int | None,
               num_samples: int | None) -> ImageArrays:
    """MNIST's training set (the first `num_samples` images if given) with t10k as its held-out split."""
    root = Path(data_dir).expanduser()
    train = _read_split(root, "train", required=True)
    test = _read_split(root, "t10k", required=False)
    images, labels = train
    if num_samples is not None:
        if not 0 < num_samples <= len(images):
            raise UsageError(f"mnist: asked for {num_samples} samples; the training set has {len(images)}")
        images, labels = images[:num_samples], labels[:num_samples]
    common = dict(name="mnist", num_classes=10, mean=MEAN, std=STD, in_channels=in_channels,
                  image_size=image_size)
    heldout = ImageArrays(images=test[0], labels=test[1], **common) if test else None
    return ImageArrays(images=images, labels=labels, heldout=heldout, **common)
