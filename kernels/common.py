"""What every hand-written algorithm shares: the local reduction, how a vector is cut into blocks,
and the power-of-two fix-up (fold) that recursive doubling and halving need on other rank counts.

Only local work lives here; every byte between ranks goes through the Comm the algorithm is given.
Exercised by: `pytest tests/unit/test_algorithm_models.py tests/test_kernels.py`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_COMBINE = {
    "sum": "add",
    "avg": "add",  # summed on the way, divided once at the end (finish)
    "prod": "mul",
    "min": "minimum",
    "max": "maximum",
}
"""Each reduction's torch function, by name: torch is imported where a tensor is touched, so the kernels'
cost models load without it (`commprof predict` starts in a tenth of the time)."""
_COMBINE_FNS: dict = {}


def combine(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
    """out = a (op) b, elementwise; `out` may alias `a` or `b`."""
    fn = _COMBINE_FNS.get(op)
    if fn is None:
        import torch

        fn = _COMBINE_FNS[op] = getattr(torch, _COMBINE[op])
    fn(a, b, out=out)


def finish(tensor: torch.Tensor, op: str, n: int) -> None:
    """The last local touch of a reduction: avg divides the sum by the rank count."""
    if op == "avg":
        tensor.div_(n)


_SCRATCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def scratch(comm, numel: int, like: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """A reusable work buffer of `numel` elements with `like`'s dtype and device, one per (comm, slot),
    grown as needed and kept while the comm lives. Allocating afresh on every call costs about as much
    as the transfer on CPU (a 32 MiB buffer page-faults for ~13 ms on the 2-core VM, against ~20 ms to
    send it); NCCL keeps its buffers for the same reason. Buffers used at the same time need different
    slots."""
    per_comm = _SCRATCH.setdefault(comm, {})
    key = (slot, like.dtype, like.device)
    buf = per_comm.get(key)
    if buf is None or buf.numel() < numel:
        import torch

        buf = per_comm[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def bounds(count: int, parts: int) -> list[int]:
    """Offsets cutting `count` elements into `parts` blocks whose sizes differ by at most one (the
    first count % parts blocks are one longer); block i is [b[i], b[i+1])."""
    size, extra = divmod(count, parts)
    out = [0]
    for i in range(parts):
        out.append(out[-1] + size + (i < extra))
    return out


def lower_pow2(n: int) -> int:
    """The largest power of two not above n (n ≥ 1)."""
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class Fold:
    """The standard fix-up for n ranks that are not a power of two (MPICH, Thakur et al. 2005): with
    p the largest power of two ≤ n and rem = n − p, the first 2·rem ranks pair up (2i, 2i+1); the even
    one hands its data to the odd one and sits out the core algorithm, which runs on p ranks, then
    gets its result back. Core rank c stands for the contiguous real ranks [first(c), first(c+1))."""

    n: int
    """Real ranks."""

    @property
    def p(self) -> int:
        """Ranks in the core (a power of two)."""
        return lower_pow2(self.n)

    @property
    def rem(self) -> int:
        """Ranks that sit out the core."""
        return self.n - self.p

    def core(self, rank: int) -> int | None:
        """Core rank of a real rank, None for the ones that sit out."""
        if rank < 2 * self.rem:
            return None if rank % 2 == 0 else rank // 2
        return rank - self.rem

    def real(self, core: int) -> int:
        """The real rank that runs core rank `core`."""
        return 2 * core + 1 if core < self.rem else core + self.rem

    def first(self, core: int) -> int:
        """First real rank core rank `core` stands for (first(p) = n)."""
        return 2 * core if core < self.rem else core + self.rem

    def partner(self, rank: int) -> int | None:
        """The rank a folded pair exchanges with, None outside the first 2·rem ranks."""
        return rank ^ 1 if rank < 2 * self.rem else None


def fold_in(comm, fold: Fold, flat: torch.Tensor, op: str, name: str) -> None:
    """The fix-up's first step for a whole-vector reduction: the even rank of a pair sends its vector,
    the odd one reduces it into its own. Nothing for ranks outside the pairs."""
    partner = fold.partner(comm.rank)
    if partner is None:
        return
    with comm.range(f"{name}::fold"):
        if fold.core(comm.rank) is None:
            comm.send(flat, dst=partner)
        else:
            incoming = scratch(comm, flat.numel(), flat)
            comm.recv(incoming, src=partner)
            combine(flat, flat, incoming, op)


def fold_out(comm, fold: Fold, flat: torch.Tensor, name: str) -> None:
    """The fix-up's last step: the odd rank of a pair sends the whole result to the even one."""
    partner = fold.partner(comm.rank)
    if partner is None:
        return
    with comm.range(f"{name}::unfold"):
        if fold.core(comm.rank) is None:
            comm.recv(flat, src=partner)
        else:
            comm.send(flat, dst=partner)


class OneChunkPerStep:
    """The model of n−1 steps that each send one of the n chunks (ring all_gather, ring reduce_scatter,
    pairwise all_to_all): the modules' `steps`, `sent_bytes` and `cost`."""

    @staticmethod
    def steps(n: int, nbytes: int) -> int:
        return n - 1

    @staticmethod
    def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
        """Every chunk but one: (n−1)/n of the size."""
        return (n - 1) * (count // n) * itemsize

    @staticmethod
    def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
        """(n−1)(α + m/n β)."""
        return (n - 1) * (alpha + beta * nbytes / n)


def log2_ceil(n: int) -> int:
    """Rounds of an algorithm that doubles its reach each step: ⌈log2 n⌉."""
    return (n - 1).bit_length()
