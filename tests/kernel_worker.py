"""One rank of the kernels test: every hand-written algorithm, every dtype, a few reduce ops and sizes
(1 element, sizes not divisible by the rank count), in both modes, checked three ways — against the
closed form (the bench's -c check), against the library collective on the same input, and against
the module's own `expected` on random input — and its bytes sent against `sent_bytes`. Exit 1 on
any mismatch, naming it. Started by tests/test_kernels.py as N processes (gloo) or under mpiexec.

    python tests/kernel_worker.py gloo|mpi [COLLECTIVE/ALGORITHM ...]
"""

import sys

import torch

from commprof import kernels
from commprof.base.world import discover
from commprof.bench.collectives import COLLECTIVES
from commprof.comm import end_process, init_comm, unsupported
from commprof.comm.dtypes import DTYPES

SENDS = ("send", "sendrecv")
ALL_OPS = ("sum", "prod", "min", "max", "avg")


def counts(collective: str, n: int) -> list[int]:
    """Reported element counts: whole vectors of odd sizes, or n × per-rank chunks."""
    if COLLECTIVES[collective].split:
        return [n * c for c in (1, 3, 130)]
    return sorted({1, n + 1, 2 * n - 1, 1031})


def sent(comm, mark: int) -> int:
    return sum(nbytes for name, nbytes, *_ in comm.recorder.ops[mark:] if name in SENDS)


def check_case(comm, module, dtype, op, count, inplace, root, failures) -> None:
    coll = COLLECTIVES[module.COLLECTIVE]
    where = f"{module.COLLECTIVE}/{module.NAME} {dtype} {op} count={count} inplace={inplace} root={root}"
    case = coll.prepare(kernels.bind(comm, module), count, DTYPES[dtype], op or "sum", inplace, root)
    case.init()
    mark = comm.recorder.mark()
    case.run()
    got_bytes = sent(comm, mark)
    want_bytes = module.sent_bytes(comm.world_size, comm.rank, count, DTYPES[dtype].itemsize, root)
    if got_bytes != want_bytes:
        failures.append(f"{where}: sent {got_bytes} B, formula {want_bytes} B")
    wrong = case.wrong()
    if wrong:
        failures.append(f"{where}: {wrong} element(s) differ from the closed form")
    if unsupported(comm.backend, module.COLLECTIVE, dtype, op, inplace) is None:
        lib = coll.prepare(comm, count, DTYPES[dtype], op or "sum", inplace, root)
        lib.init()
        lib.run()
        ours, theirs = case.output.float(), lib.output.float()
        same = torch.allclose(ours, theirs) if op == "avg" else torch.equal(ours, theirs)
        if not same:
            failures.append(f"{where}: differs from the library's {module.COLLECTIVE}")


def check_random(comm, module, failures) -> None:
    """The module's own `expected` on random small integers (float32, and int64 with max)."""
    n, r, coll = comm.world_size, comm.rank, module.COLLECTIVE
    per_rank = 7 * n if COLLECTIVES[coll].split else 37
    for dtype, op in ((torch.float32, "sum"), (torch.int64, "max")):
        inputs = [torch.randint(0, 9, (per_rank,), generator=torch.Generator().manual_seed(100 + s)).to(dtype)
                  for s in range(n)]
        x = inputs[r].clone()
        if coll == "all_reduce":
            module.run(comm, x, op=op)
            got = x
        elif coll == "broadcast":
            module.run(comm, x, src=n - 1)
            got = x
        elif coll == "all_gather":
            got = torch.empty(n * per_rank, dtype=dtype)
            module.run(comm, got, x)
        elif coll == "reduce_scatter":
            got = torch.empty(per_rank // n, dtype=dtype)
            module.run(comm, got, x, op=op)
        else:
            got = torch.empty_like(x)
            module.run(comm, got, x)
        want = module.expected(inputs, r, op=op, root=n - 1)
        if not torch.equal(got, want):
            failures.append(f"{coll}/{module.NAME} random {dtype} {op}: differs from expected()")
        if not COLLECTIVES[coll].reduces:
            break  # one dtype is enough for data movement


def main(backend: str, only: list[str]) -> int:
    comm = init_comm(discover(), backend=backend, timeout_s=60)
    n, failures = comm.world_size, []
    for collective, by_name in kernels.ALGORITHMS.items():
        coll = COLLECTIVES[collective]
        for name, module in by_name.items():
            if only and f"{collective}/{name}" not in only:
                continue
            roots = (0, n - 1) if collective == "broadcast" else (0,)
            for dtype in kernels_dtypes():
                ops = (ALL_OPS if dtype in ("float32", "int32") else ("sum",)) if coll.reduces else (None,)
                for op in ops:
                    if op and kernels.unsupported(dtype, op):
                        continue
                    for count in counts(collective, n):
                        for inplace in kernels.modes(module):
                            for root in roots:
                                check_case(comm, module, dtype, op, count, inplace, root, failures)
            check_random(comm, module, failures)
    comm.close()
    for line in failures[:20]:
        print(f"rank {comm.rank}: {line}", file=sys.stderr)
    return 1 if failures else 0


def kernels_dtypes() -> list[str]:
    return list(DTYPES)


if __name__ == "__main__":
    end_process(main(sys.argv[1], sys.argv[2:]))  # not sys.exit: see commprof.comm.end_process
