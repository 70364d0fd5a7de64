"""The merged trace is written whole or not at all (record/merge.py write_merged): when the file cannot be
written to the end — here a real write refused past RLIMIT_FSIZE (EFBIG), as a full disk refuses one
(ENOSPC) — no trace.json is left under its final name, no temporary beside it, and the error is one line naming
the file."""

import resource
import signal

import pytest

from commprof.base.files import OutputError
from commprof.record.merge import write_merged


@pytest.fixture
def small_files():
    """Files of this process may grow to 64 KiB; SIGXFSZ ignored, so a write past it fails with EFBIG."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def events(n: int) -> list[dict]:
    return [{"name": f"all_reduce {i}", "ph": "X", "ts": i, "dur": 1, "pid": 0, "tid": 0, "cat": "comm"}
            for i in range(n)]


def test_a_trace_too_large_to_write_leaves_nothing_and_names_the_file(tmp_path, small_files):
    with pytest.raises(OutputError, match=f"cannot write {tmp_path / 'trace.json'}: File too large"):
        write_merged(tmp_path, [events(5000)], None)
    assert list(tmp_path.iterdir()) == []


def test_a_trace_that_fits_is_whole(tmp_path, small_files):
    path = write_merged(tmp_path, [events(50)], None)
    assert path.name == "trace.json" and path.read_text().endswith("}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]
