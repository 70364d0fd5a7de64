"""In-flight ranges of synchronous ops, collective and point-to-point, seen by a real NVTX injection library:
`commprof bench` with the library's all_reduce and the hand-written ring (sendrecv steps). Each op's
start/end range, in domain `commprof comm (world)`, lies inside the push/pop range of the call that ran it,
on the same thread, with the same attributes. (Async ops, ended on another thread or in wait(), are in
tests/test_nvtx_run.py; against the real nsys in tests/test_nsys.py.)"""

import shutil
import sys
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import nvtx_recorder  # noqa: E402

ATTRS = ("category", "message", "color", "payload")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_every_synchronous_op_is_in_flight_inside_its_call(tmp_path):
    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    proc = commprof("bench", "all_reduce", "--algo", "library,ring", "--nproc", "2", "-b", "1K", "-e", "1K", env=env)
    assert proc.returncode == 0, proc.stderr
    records = nvtx_recorder.read_records(prefix)
    assert len({r["pid"] for r in records}) == 2
    for pid in {r["pid"] for r in records}:
        mine = [r for r in records if r["pid"] == pid and r["domain"] == "commprof"]
        calls, stack = [], []
        for r in mine:  # each comm push with the time of its pop
            if r["kind"] == "push":
                stack.append(r)
            elif r["kind"] == "pop":
                opened = stack.pop()
                if opened["category"] == "comm":
                    calls.append((opened, r["ts_ns"]))
        calls.sort(key=lambda c: c[0]["ts_ns"])
        flights = nvtx_recorder.start_end_ranges([r for r in records if r["pid"] == pid])
        names = {r["message"].split(" ")[0] for r in flights}
        assert names == {"all_reduce", "sendrecv"}  # the library's collective and the ring's p2p steps
        assert len(flights) == len(calls) > 0
        for flight, (push, pop_ns) in zip(flights, calls):
            assert flight["domain"] == "commprof comm (world)"
            assert [flight[k] for k in ATTRS] == [push[k] for k in ATTRS]
            assert flight["tid"] == flight["end_tid"] == push["tid"]  # a synchronous op ends where it began
            assert push["ts_ns"] <= flight["ts_ns"] and flight["ts_ns"] + flight["dur_ns"] <= pop_ns
