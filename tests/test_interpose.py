"""Interposition (commprof/intercept/interpose.py): an unchanged torch.distributed script's collectives go
through Comm — results as torch's, and every call in the op log with its bytes and group — on 2 and 3 real
gloo ranks (tests/interpose_worker.py): called by `torch.distributed`'s names, by distributed_c10d's, and
through torch's object collectives; what Comm has no form for is counted as unseen, once."""

import json
import sys
from pathlib import Path

import pytest
from spawn import spawn

WORKER = str(Path(__file__).with_name("interpose_worker.py"))


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_plain_script_is_seen_call_by_call(nproc):
    proc = spawn([sys.executable, WORKER], nproc=nproc, backend="gloo")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                   key=lambda d: d["rank"])
    assert [d["rank"] for d in lines] == list(range(nproc))
    for d in lines:
        assert d["failures"] == []
        assert d["unseen"] == {"all_to_all_single": 1, "all_gather_into_tensor": 1, "gather": 1, "scatter": 1}
        assert d["ops"] == (26 if d["rank"] < 2 else 24)  # ranks 0 and 1 also ran the pair's two ops


CHAINED = """\
import sys, time, torch, torch.distributed as dist
from commprof.intercept import interpose


def main():
    ip = interpose.install()
    dist.init_process_group("gloo")
    comm, rank = ip.comm(None), dist.get_rank()
    sys.setswitchinterval(5.0)  # rank 0 keeps the GIL: gloo's thread waits for it to run its own callback
    early = {"handle": 0, "work": 0}
    for _ in range(20):
        for kind in early:
            dist.barrier()
            if rank == 1:  # joins 10 ms late: rank 0's op completes while it spins, its callbacks added
                time.sleep(0.01)
                dist.all_reduce(torch.ones(4))
                continue
            before = len(comm.recorder.ops)
            if kind == "handle":  # DDP's routed reducer chains on a Handle's future
                waitable = comm.all_reduce(torch.ones(4), async_op=True)
            else:  # a library chaining on an async call's Work
                waitable = dist.all_reduce(torch.ones(4), async_op=True)
            spin = time.perf_counter() + 0.03
            while time.perf_counter() < spin:
                pass
            logged = waitable.get_future().then(lambda _: len(comm.recorder.ops) - before).wait()
            early[kind] += logged == 0
            waitable.wait()
    if rank == 0:
        print(early, len(comm.recorder.ops))
    dist.destroy_process_group()
    interpose.uninstall()


main()
"""

def test_what_chains_on_an_async_op_runs_after_the_op_is_logged(tmp_path):
    # a callback added to a completed future runs at once, on the caller's thread, while gloo's thread may
    # still wait for the GIL to run the completion callback added at issue: a reducer woken that way ended
    # its iteration before the op was logged, and a warm-up all_reduce went uncounted
    script = tmp_path / "chained.py"
    script.write_text(CHAINED)
    proc = spawn([sys.executable, str(script)], nproc=2, backend="gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["{'handle':", "0,", "'work':", "0}", "80"], proc.stdout
