"""Every hand-written collective in kernels/, run in process on a FakeWorld (tests/support/fake_comm.py) at
1, 2, 3, 4, 6 and 8 ranks (3: one folded pair, 6: two; kernels/common.py's Fold), in each mode it runs (out
of place, the input left untouched, and in place): each rank ends with what kernels/reference.py computes
from every rank's input; the kernel moves bytes by point-to-point ops only; and the bytes each rank sends,
as its Comm logged them (comm/base.py) and record/volume.py counts them (wire bytes), equal the algorithm's
closed form below — each cited from its module — and the module's own `sent_bytes` (what `commprof
predict` prices), with the p2p calls where the closed form fixes them. The multi-rank job
(tests/test_kernels.py) still checks every dtype, op and size against gloo's and MPI's own collectives.
The last tests hold the fake to its word: a broken kernel fails within the timeout instead of hanging.

    pytest tests/unit/test_fake_comm_kernels.py
"""

from __future__ import annotations

import pytest
import torch
from support.fake_comm import FakeWorld, RankFailed

from commprof import kernels
from commprof.base.measurement import P2P
from commprof.kernels.common import Fold, log2_ceil
from commprof.record.volume import step_volume

SIZES = (1, 2, 3, 4, 6, 8)
COUNT = 840
"""Elements of the whole vector (all_reduce, broadcast) or of world_size × the chunk: divisible by every
rank count and its power-of-two core, so each closed form below holds exactly."""
UNEVEN = 7 * 8 + 5
"""An all_reduce/broadcast count no rank count divides: blocks of unequal sizes (only `sent_bytes` applies)."""
ITEM = 8  # float64 holding small integers: every sum is exact, whatever order a kernel adds in


def _pair(n: int, r: int) -> tuple[bool, bool]:
    """(sits out the power-of-two core, is the odd rank of a folded pair): common.Fold, MPICH's fix-up."""
    fold = Fold(n)
    return fold.core(r) is None, fold.partner(r) is not None and fold.core(r) is not None


def _ranks_of(n: int, c: int) -> int:
    """Real ranks core rank c stands for: 2 for the first rem, else 1."""
    return 2 if c < Fold(n).rem else 1


def _doubling(n: int, r: int, chunk: int) -> int:
    """Recursive doubling's core sends (all_gather_recursive_doubling.py: "its gathered range at each step"):
    at distance d, the d core ranks' blocks it holds, each as many chunks as real ranks it stands for."""
    c, p = Fold(n).core(r), Fold(n).p
    return sum(_ranks_of(n, j) for k in range(log2_ceil(p))
               for j in range(c & ~((1 << k) - 1), (c & ~((1 << k) - 1)) + (1 << k))) * chunk


def ring_all_reduce(n, r, S, root):  # all_reduce_ring.py: "Every rank sends 2(n−1)/n of the vector"
    return 2 * (n - 1) * S // n, 2 * (n - 1)


def recursive_doubling_all_reduce(n, r, S, root):  # all_reduce_recursive_doubling.py: "every step moves all m
    out, odd = _pair(n, r)  # bytes"; a folded pair sends "one whole vector each way"
    steps = log2_ceil(Fold(n).p)  # calls: the out rank sends and gets back; the odd one also receives and sends
    return (S, 2) if out else ((steps + odd) * S, steps + 2 * odd)


def rabenseifner(n, r, S, root):  # all_reduce_rabenseifner.py: "2(p−1)/p of the vector sent"; the fold one
    out, odd = _pair(n, r)  # whole vector each way
    p = Fold(n).p
    return (S, 2) if out else (2 * (p - 1) * S // p + odd * S, None)


def binary_tree(n, r, S, root):  # all_reduce_binary_tree.py: "The whole vector to the parent, and to each child"
    sends = (r > 0) + sum(c < n for c in (2 * r + 1, 2 * r + 2))
    return sends * S, None


def one_chunk_per_step(n, r, S, root):  # common.OneChunkPerStep: "n−1 steps that each send one of the n chunks"
    return (n - 1) * S // n, n - 1


def bruck(n, r, S, root):  # all_gather_bruck.py: "Σ min(d, n−d) blocks over the steps = n − 1 blocks"
    return (n - 1) * S // n, log2_ceil(n)


def recursive_doubling_all_gather(n, r, S, root):  # all_gather_recursive_doubling.py: "a folded pair: the even
    out, odd = _pair(n, r)  # rank its chunk, the odd one the whole result back"
    return (S // n, 2) if out else (_doubling(n, r, S // n) + odd * S, None)


def recursive_halving(n, r, S, root):  # reduce_scatter_recursive_halving.py: "A core rank sends everything but
    out, odd = _pair(n, r)  # the chunks it ends with; a folded pair: the even rank its whole input, the odd one
    if out:  # the even rank's chunk back"
        return S, 2
    return S - _ranks_of(n, Fold(n).core(r)) * S // n + odd * S // n, None


def binomial_tree(n, r, S, root):  # broadcast_binomial_tree.py: "The whole vector to each child"; relative rank
    v = (r - root) % n  # v sends to v + 2^j for every 2^j below its lowest set bit (the root: below 2^⌈log2 n⌉)
    low = v & -v if v else 1 << log2_ceil(n)
    children = sum(v + (1 << j) < n for j in range(low.bit_length() - 1))
    return children * S, children + (v > 0)


def chain(n, r, S, root):  # broadcast_chain.py: "The whole vector once, by every rank but the last in the chain"
    v = (r - root) % n  # one segment below SEGMENT_BYTES: one send, one receive
    return (S if v < n - 1 else 0), (v < n - 1) + (v > 0)


CLOSED = {
    ("all_reduce", "ring"): ring_all_reduce, ("all_reduce", "recursive_doubling"): recursive_doubling_all_reduce,
    ("all_reduce", "rabenseifner"): rabenseifner, ("all_reduce", "binary_tree"): binary_tree,
    ("all_gather", "ring"): one_chunk_per_step, ("all_gather", "recursive_doubling"): recursive_doubling_all_gather,
    ("all_gather", "bruck"): bruck, ("reduce_scatter", "ring"): one_chunk_per_step,
    ("reduce_scatter", "recursive_halving"): recursive_halving, ("broadcast", "binomial_tree"): binomial_tree,
    ("broadcast", "chain"): chain, ("all_to_all", "pairwise"): one_chunk_per_step,
}
"""(collective, algorithm) -> f(n, rank, S bytes, root) = (bytes the rank sends, its p2p calls — sends,
receives and sendrecvs — or None)."""
ALGORITHMS = [(c, a) for c, by_name in kernels.CATALOG.items() for a in by_name]


def call(module, comm, x: torch.Tensor, *, inplace: bool, op: str, root: int) -> torch.Tensor:
    """Run `module` on rank input `x` laid out as its Comm method takes it (the in-place layouts are NCCL's,
    comm/base.py's docstring); what the rank ends with."""
    n, r, coll = comm.world_size, comm.rank, module.COLLECTIVE
    if coll == "broadcast":
        module.run(comm, x, src=root)
        return x
    if coll == "all_reduce":
        out = None if inplace else torch.empty_like(x)
        module.run(comm, x, op=op, output=out)
        return x if inplace else out
    if coll == "all_gather":
        out = torch.empty(n * x.numel(), dtype=x.dtype)
        inp = out[r * x.numel():(r + 1) * x.numel()].copy_(x) if inplace else x
        module.run(comm, out, inp)
        return out
    if coll == "reduce_scatter":
        chunk = x.numel() // n
        out = x[r * chunk:(r + 1) * chunk] if inplace else torch.empty(chunk, dtype=x.dtype)
        module.run(comm, out, x, op=op)
        return out.clone()
    out = torch.empty_like(x)
    module.run(comm, out, x)
    return out


def inputs_for(coll: str, n: int, count: int) -> list[torch.Tensor]:
    """Each rank's input: small random integers (all_gather's: one chunk of the count)."""
    numel = count // n if coll == "all_gather" else count
    return [torch.randint(-9, 10, (numel,), generator=torch.Generator().manual_seed(7 + r)).double()
            for r in range(n)]


def run_kernel(coll: str, name: str, n: int, count: int, *, inplace: bool, op: str = "sum", root: int = 0):
    """Every rank's (result, its ops, its unchanged-input flag) for one call of the kernel."""
    module = kernels.find(coll, name)
    inputs = inputs_for(coll, n, count)

    def rank(comm):
        x = inputs[comm.rank].clone()
        got = call(module, comm, x, inplace=inplace, op=op, root=root)
        untouched = inplace or coll == "broadcast" or torch.equal(x, inputs[comm.rank])
        return got, list(comm.recorder.ops), untouched
    return module, inputs, FakeWorld(n).run(rank)


def sent(ops: list[tuple]) -> float:
    """Wire bytes the rank sent, as the volume table counts them (send and sendrecv 1×, recv 0×)."""
    return sum(v["wire_bytes"] for v in step_volume(ops).values())


CASES = [(c, a, n, inplace) for c, a in ALGORITHMS for n in SIZES
         for inplace in kernels.modes(kernels.find(c, a))]


@pytest.mark.parametrize("coll,name,n,inplace", CASES,
                         ids=[f"{c}-{a}-{n}ranks-{'inplace' if i else 'outofplace'}" for c, a, n, i in CASES])
def test_kernel_result_and_bytes_per_rank(coll, name, n, inplace):
    root = n - 1 if coll == "broadcast" else 0  # a root other than 0: relative ranks must be right
    module, inputs, ranks = run_kernel(coll, name, n, COUNT, inplace=inplace, root=root)
    S = COUNT * ITEM
    for r, (got, ops, untouched) in enumerate(ranks):
        assert torch.equal(got, module.expected(inputs, r, op="sum", root=root)), f"rank {r}: wrong result"
        assert untouched, f"rank {r}: an out-of-place call wrote its input"
        assert {o[0] for o in ops} <= set(P2P), f"rank {r}: not point-to-point only: {ops}"
        want, calls = CLOSED[coll, name](n, r, S, root)
        assert sent(ops) == want, f"rank {r}: sent {sent(ops)} B, closed form {want} B"
        assert module.sent_bytes(n, r, COUNT, ITEM, root) == want, f"rank {r}: the module's sent_bytes"
        if calls is not None:
            assert len(ops) == calls, f"rank {r}: {len(ops)} p2p calls, closed form {calls}"


REDUCING = [(c, a) for c, a in ALGORITHMS if c in ("all_reduce", "reduce_scatter")]


@pytest.mark.parametrize("coll,name", REDUCING, ids=[f"{c}-{a}" for c, a in REDUCING])
@pytest.mark.parametrize("op", ["max", "avg"])
def test_other_reductions(coll, name, op):
    module, inputs, ranks = run_kernel(coll, name, 3, COUNT // 4 * 3, inplace=False, op=op)
    for r, (got, _, _) in enumerate(ranks):
        assert torch.allclose(got, module.expected(inputs, r, op=op)), f"rank {r}"


ROOTED = [(c, a) for c, a in ALGORITHMS if c in ("all_reduce", "broadcast")]


@pytest.mark.parametrize("coll,name", ROOTED, ids=[f"{c}-{a}" for c, a in ROOTED])
@pytest.mark.parametrize("n", [3, 4])
def test_uneven_blocks_match_sent_bytes(coll, name, n):
    """A vector no rank count divides: blocks differ by one element; the module's model still holds, and the
    ranks together send what the closed form says of them all (ring: 2(n−1) × the vector)."""
    module, inputs, ranks = run_kernel(coll, name, n, UNEVEN, inplace=True, root=1)
    for r, (got, ops, _) in enumerate(ranks):
        assert torch.equal(got, module.expected(inputs, r, root=1)), f"rank {r}"
        assert sent(ops) == module.sent_bytes(n, r, UNEVEN, ITEM, 1), f"rank {r}"
    if (coll, name) == ("all_reduce", "ring"):
        assert sum(sent(ops) for _, ops, _ in ranks) == 2 * (n - 1) * UNEVEN * ITEM


# ---- a broken kernel fails the test, and fast -----------------------------------------------------
def test_an_unmatched_send_fails_within_the_timeout():
    def rank(comm):
        if comm.rank == 0:
            comm.send(torch.ones(4), dst=1)  # rank 1 never receives it: a send completes only once received
    with pytest.raises(RankFailed, match="rank 0 of 2: PeerTimeoutError"):
        FakeWorld(2, timeout_s=0.2).run(rank)


def test_a_failing_rank_wakes_its_peers_and_is_the_one_reported():
    def rank(comm):
        if comm.rank == 2:
            raise ValueError("kernel bug")
        comm.all_reduce(torch.ones(3))  # would wait for rank 2 until the timeout
    with pytest.raises(RankFailed, match="rank 2 of 3: ValueError: kernel bug"):
        FakeWorld(3, timeout_s=60).run(rank)


def test_ranks_that_disagree_on_a_collective_raise_desync():
    with pytest.raises(RankFailed, match="DesyncError: .*disagree"):
        FakeWorld(2).run(lambda comm: comm.all_reduce(torch.ones(2 + comm.rank)))
