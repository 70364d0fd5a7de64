"""The flight ring kept in the job folder (commprof/comm/failure/ring_file.py), without a job: what a rank appends is
read back from its file alone, across the ring's wrap and new groups; two ranks' files name a desync; the
launcher and the claimant judge a death by them, except a death that came from outside."""

import signal
from types import SimpleNamespace

import torch

from commprof.base import job
from commprof.comm.failure import flight, ring_file
from commprof.comm.failure.watchdog import _verdict
from commprof.launcher import launch
from commprof.record.clock import CpuClock
from commprof.record.recorder import RING_LENGTH, OpRecorder


def recorder_of(*groups: tuple[str, list[int]]) -> OpRecorder:
    recorder = OpRecorder(CpuClock())
    for label, members in groups:
        comm = SimpleNamespace(label=label, members=members)
        comm._ring = recorder.append_ring
        recorder.comms.append(comm)
    return recorder


def as_read(entry: tuple) -> list:
    label, seq, name, nbytes, dtype = entry
    return [label, seq, name, nbytes, None if dtype is None else str(dtype).removeprefix("torch.")]


def test_what_a_rank_appends_is_read_back_from_its_file(tmp_path):
    recorder = recorder_of(("world", [0, 1, 2, 3]), ("dp", [1, 3]))
    early = ("world", 1, "all_reduce", 4096, torch.float32)
    recorder.append_ring(early)  # before the ring was kept: written when it is
    ring_file.keep(recorder, tmp_path, 3)
    world, dp = recorder.comms
    assert world._ring == recorder.append_ring != recorder.ring.append
    kept = recorder.append_ring
    ring_file.keep(recorder, tmp_path, 3)  # once is enough: a second keep changes nothing
    assert recorder.append_ring is kept
    world._ring(("world", 2, "barrier", 0, None))
    dp._ring(("dp", 1, "all_gather", 128, torch.bfloat16))
    snap = ring_file.read(tmp_path)[3]
    assert snap["ring"] == [as_read(e) for e in recorder.ring]
    assert snap["seqs"] == {"world": 2, "dp": 1} and snap["busy"] is None
    assert snap["groups"] == {"world": [[0, 3]], "dp": [[1, 1], [3, 3]]}
    assert ring_file.read(tmp_path, [0, 1, 2]) == {}  # no file, no record


def test_the_file_holds_the_newest_ops_after_the_ring_wraps(tmp_path):
    recorder = recorder_of(("world", [0, 1]))
    ring_file.keep(recorder, tmp_path, 0)
    for seq in range(1, 3 * RING_LENGTH + 8):
        recorder.append_ring(("world", seq, "all_reduce", seq, torch.float32))
    ring = ring_file.read(tmp_path)[0]["ring"]
    assert [e[1] for e in ring] == list(range(2 * RING_LENGTH + 8, 3 * RING_LENGTH + 8))
    assert ring == [as_read(e) for e in recorder.ring]
    assert (tmp_path / "rank0.ring").stat().st_size == ring_file.SIZE


def test_a_torn_or_foreign_record_is_no_record(tmp_path):
    recorder = recorder_of(("world", [0, 1]))
    ring_file.keep(recorder, tmp_path, 0)
    for seq in (1, 2, 3):
        recorder.append_ring(("world", seq, "all_reduce", 8, torch.float32))
    path, size = tmp_path / "rank0.ring", ring_file.RECORD.size
    data = bytearray(path.read_bytes())
    # seq 2's record torn by a kill in the middle of its write: its two numbers differ
    data[2 * size + size - 8:3 * size] = (99).to_bytes(8, "little")
    # seq 3's names an op the tables do not (written after they were read)
    ring_file.RECORD.pack_into(data, 3 * size, 3, 3, 8, 0, 7, 1, 3)
    path.write_bytes(bytes(data))
    assert ring_file.read(tmp_path)[0]["ring"] == [["world", 1, "all_reduce", 8, "float32"]]
    (tmp_path / "rank1.ring").write_bytes(b"\0" * 10)
    (tmp_path / "rank1.ring.json").write_text("{}")
    assert set(ring_file.read(tmp_path)) == {0}


def two_ranks(tmp_path, extra_on: int) -> None:
    """Two ranks' ring files: both all_reduce DDP's bucket, then `extra_on` all_reduces 4 floats first."""
    for rank in (0, 1):
        recorder = recorder_of(("world", [0, 1]))
        ring_file.keep(recorder, tmp_path, rank)
        recorder.append_ring(("world", 1, "all_reduce", 76800, torch.float32))
        recorder.append_ring(("world", 2, "all_reduce", 16 if rank == extra_on else 76800, torch.float32))


def test_two_files_name_the_desync_the_backend_aborted_on(tmp_path):
    two_ranks(tmp_path, extra_on=1)
    line = ("desync at all_reduce seq 2 (world): rank 0 called all_reduce 75 KiB float32, "
            "rank 1 called all_reduce 16 B float32")
    assert flight.first_divergence(ring_file.read(tmp_path)) == line
    # the claimant: rank 1 did not answer; its file speaks for it, and it is not named as silent
    alive = {0: ring_file.read(tmp_path)[0] | {"busy": "all_reduce (world)"}}
    assert _verdict(3, "rank 0: all_reduce failed", alive, 2, 0, ring_file.read(tmp_path, [1])) == (4, line)
    assert _verdict(3, "rank 0: all_reduce failed", alive, 2, 0) == (
        3, "rank 0: all_reduce failed; rank 1 did not answer on the control plane")


def test_the_launcher_judges_an_abort_by_the_files_and_a_kill_by_itself(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(job.ENV, str(tmp_path))
    two_ranks(tmp_path, extra_on=0)
    assert launch._death("rank 1", -signal.SIGKILL, tmp_path) == 3  # from outside: never the backend's abort
    assert capsys.readouterr().err == "commprof: error: rank 1 was killed by SIGKILL\n"
    (tmp_path / job.FAILURE).unlink()
    assert launch._death("rank 1", -signal.SIGABRT, tmp_path) == 4
    assert capsys.readouterr().err.startswith("commprof: error: desync at all_reduce seq 2 (world): rank 0 called "
                                              "all_reduce 16 B float32")
    single = tmp_path / "one"
    single.mkdir()
    assert launch._desync(single) is None
