"""MNIST's IDX files written by hand (big-endian header, then the bytes), plain or gzipped, for the data
tests (tests/unit/test_data.py) and the run tests that train on a folder of them (tests/test_run_cli.py)."""

import gzip
import struct

import numpy as np


def write_idx(path, array, *, gz=False, magic=None):
    dims = array.ndim
    magic = (0x0800 | dims) if magic is None else magic
    raw = struct.pack(f">I{dims}I", magic, *array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
