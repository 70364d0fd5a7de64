"""Data sources: synthetic by default, real MNIST, CIFAR-10/100 and text files from a local folder.

    source = open_source("cifar10", data_dir="~/data", seed=0)
    idx = global_indices(source.num_samples, seed=0, epoch=e, step=t, global_batch=G)
    batch = source.get(shard(idx, rank=rank, world_size=world_size))

Every rank builds the same global batch from (seed, epoch, step) and takes its contiguous share, so
step t trains on the same samples at any number of ranks. Nothing is ever downloaded: a missing file is
a UsageError naming the path and what belongs there.

Exercised by: `pytest tests/unit/test_data.py`.
"""

from __future__ import annotations

from commprof.base.errors import UsageError
from commprof.base.measurement import SOURCES
from commprof.data.base import Batch, Source
from commprof.data.cifar import open_cifar
from commprof.data.masked import MaskedText
from commprof.data.mnist import open_mnist
from commprof.data.sampling import global_indices, shard, steps_per_epoch
from commprof.data.synthetic_image import SyntheticImage
from commprof.data.synthetic_text import SyntheticText
from commprof.data.text import open_text

__all__ = ["Batch", "Source", "open_source", "global_indices", "shard", "steps_per_epoch", "SOURCES", "TASKS"]

TASKS = ("classify", "lm", "mlm")
"""classify: images and classes; lm: next-token prediction; mlm: masked-token prediction."""

_WHAT = {"mnist": "a folder with the MNIST IDX files", "cifar10": "the folder holding cifar-10-batches-py/",
         "cifar100": "the folder holding cifar-100-python/", "text": "a UTF-8 text file"}


def _positive(what: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{what} must be at least 1, not {value}")


def open_source(name: str, *, data_dir: str | None, seed: int, image_size: int | None = None,
                in_channels: int | None = None, num_classes: int | None = None, seq_len: int = 64,
                num_samples: int | None = None, task: str = "classify") -> Source:
    """The training source `name` for `task`, its held-out split in `.heldout`.

    synthetic: images for classify (3x32x32 and 10 classes by default; 1x28x28 when asked for one
    channel or 28 pixels; N = 60000 at 28 pixels, else 50000), token walks for lm/mlm (vocabulary 65
    by default, N = 50000). Real sets ignore `seed` except for mlm masks; `num_samples` keeps the first
    N samples; `num_classes`, if given, must match the data (for text: the character vocabulary, before
    mlm adds its mask token). `data_dir` is ignored for synthetic data.
    """
    if name not in SOURCES:
        raise UsageError(f"unknown data source {name!r}; choose from {', '.join(SOURCES)}")
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    for what, value in (("image size", image_size), ("in_channels", in_channels),
                        ("num_classes", num_classes), ("seq_len", seq_len), ("num_samples", num_samples)):
        _positive(what, value)
    text_task = task != "classify"
    if name == "synthetic":
        if text_task:
            source = SyntheticText(seed=seed, num_samples=num_samples or 50_000, num_classes=num_classes or 65,
                                   seq_len=seq_len)
        else:
            if in_channels is None:
                in_channels = 1 if image_size == 28 else 3
            if image_size is None:
                image_size = 28 if in_channels == 1 else 32
            source = SyntheticImage(seed=seed, num_samples=num_samples or (60_000 if image_size == 28 else 50_000),
                                    num_classes=num_classes or 10, in_channels=in_channels,
                                    image_size=image_size)
    else:
        if text_task != (name == "text"):
            raise UsageError(f"{name} is {'text' if name == 'text' else 'image'} data and task {task} needs "
                             f"{'text' if text_task else 'image'} data")
        if data_dir is None:
            raise UsageError(f"{name} is read from local files: give --data-dir ({_WHAT[name]})")
        if name == "text":
            source = open_text(data_dir, seq_len=seq_len, num_samples=num_samples)
        elif name == "mnist":
            source = open_mnist(data_dir, in_channels=in_channels, image_size=image_size, num_samples=num_samples)
        else:
            source = open_cifar(name, data_dir, in_channels=in_channels, image_size=image_size,
                                num_samples=num_samples)
        if num_classes is not None and num_classes != source.num_classes:
            unit = "characters" if name == "text" else "classes"
            raise UsageError(f"{name} has {source.num_classes} {unit}, not {num_classes}")
    if task == "mlm":
        source = MaskedText(source, seed=seed)
    return source
