"""The collectives `commprof bench` measures, each filling the same small interface (as nccl-tests does):

  split        the reported size is world_size × per-rank count (all_gather, reduce_scatter, all_to_all)
  bus_factor   busbw = algbw × bus_factor(n), nccl-tests' factors
  prepare      buffers for one (count, dtype, op, mode) -> a Case: run(), init(), wrong()

`count` is always the element count of the reported size. Adding a collective means adding one
`prepare_*` function and one line in COLLECTIVES. Exercised by: `pytest tests/test_collectives.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from commprof.bench import data


@dataclass
class Case:
    """One prepared measurement: `run` is what gets timed; `init` + `run` + `wrong` is the check."""

    run: Callable[[], None]
    init: Callable[[], None]
    wrong: Callable[[], int]
    output: torch.Tensor | None = None
    """The buffer `wrong` checks."""


@dataclass(frozen=True)
class Collective:
    name: str
    split: bool
    """Size = world_size × per-rank count (rounded down to a multiple of world_size elements)."""
    reduces: bool
    """Takes a reduce op (-o)."""
    bus_factor: Callable[[int], float]
    prepare: Callable[..., Case]


def _fill(t: torch.Tensor, values: torch.Tensor) -> None:
    t.copy_(values.to(t.dtype))


def prepare_all_reduce(comm, count, dtype, op, inplace, root):
    n, dev = comm.world_size, comm.device
    src = torch.empty(count, dtype=dtype, device=dev)
    out = None if inplace else torch.empty_like(src)
    expected = data.reduce_expected(op, n, count)
    return Case(run=partial(comm.all_reduce, src, op=op, output=out),
                init=lambda: _fill(src, data.reduce_input(op, comm.rank, n, count)),
                wrong=lambda: data.count_wrong(src if inplace else out, expected, n=n, approx=op == "avg"),
                output=src if inplace else out)


def prepare_all_gather(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    out = torch.empty(count, dtype=dtype, device=dev)
    inp = out[r * chunk:(r + 1) * chunk] if inplace else torch.empty(chunk, dtype=dtype, device=dev)
    expected = torch.cat([data.pattern(s, chunk) for s in range(n)])

    def init():
        out.fill_(data.SENTINEL)
        _fill(inp, data.pattern(r, chunk))

    return Case(run=partial(comm.all_gather, out, inp), init=init,
                wrong=lambda: data.count_wrong(out, expected, n=n, approx=False), output=out)


def prepare_reduce_scatter(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    inp = torch.empty(count, dtype=dtype, device=dev)
    out = inp[r * chunk:(r + 1) * chunk] if inplace else torch.empty(chunk, dtype=dtype, device=dev)
    expected = data.reduce_expected(op, n, chunk, offset=r * chunk)
    return Case(run=partial(comm.reduce_scatter, out, inp, op=op),
                init=lambda: _fill(inp, data.reduce_input(op, r, n, count)),
                wrong=lambda: data.count_wrong(out, expected, n=n, approx=op == "avg"), output=out)


def prepare_broadcast(comm, count, dtype, op, inplace, root):
    r, buf = comm.rank, torch.empty(count, dtype=dtype, device=comm.device)
    expected = data.pattern(root, count)

    def init():
        if r == root:
            _fill(buf, expected)
        else:
            buf.fill_(data.SENTINEL)

    return Case(run=partial(comm.broadcast, buf, src=root), init=init,
                wrong=lambda: data.count_wrong(buf, expected, n=comm.world_size, approx=False), output=buf)


def prepare_reduce(comm, count, dtype, op, inplace, root):
    n, r, dev = comm.world_size, comm.rank, comm.device
    src = torch.empty(count, dtype=dtype, device=dev)
    out = None if inplace else torch.empty_like(src)
    expected = data.reduce_expected(op, n, count)

    def wrong():
        if r != root:
            return 0  # only the root's buffer is defined afterwards
        return data.count_wrong(src if inplace else out, expected, n=n, approx=op == "avg")

    return Case(run=partial(comm.reduce, src, dst=root, op=op, output=out),
                init=lambda: _fill(src, data.reduce_input(op, r, n, count)), wrong=wrong,
                output=src if inplace else out)


def prepare_all_to_all(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    inp = torch.empty(count, dtype=dtype, device=dev)
    out = inp if inplace else torch.empty_like(inp)
    expected = data.all_to_all_expected(r, n, chunk)
    return Case(run=partial(comm.all_to_all, out, inp),
                init=lambda: _fill(inp, data.all_to_all_input(r, n, chunk)),
                wrong=lambda: data.count_wrong(out, expected, n=n, approx=False), output=out)


def prepare_sendrecv(comm, count, dtype, op, inplace, root):
    n, r, dev = comm.world_size, comm.rank, comm.device
    send = torch.empty(count, dtype=dtype, device=dev)
    recv = torch.empty(count, dtype=dtype, device=dev)
    expected = data.pattern((r - 1) % n, count)

    def init():
        _fill(send, data.pattern(r, count))
        recv.fill_(data.SENTINEL)

    return Case(run=partial(comm.sendrecv, send, recv, dst=(r + 1) % n, src=(r - 1) % n), init=init,
                wrong=lambda: data.count_wrong(recv, expected, n=n, approx=False), output=recv)


def prepare_barrier(comm, count, dtype, op, inplace, root):
    return Case(run=comm.barrier, init=lambda: None, wrong=lambda: 0)


def _ring_all_reduce(n: int) -> float:
    return 2 * (n - 1) / n


def _ring(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", split=False, reduces=True, bus_factor=_ring_all_reduce, prepare=prepare_all_reduce),
    Collective("all_gather", split=True, reduces=False, bus_factor=_ring, prepare=prepare_all_gather),
    Collective("reduce_scatter", split=True, reduces=True, bus_factor=_ring, prepare=prepare_reduce_scatter),
    Collective("broadcast", split=False, reduces=False, bus_factor=_one, prepare=prepare_broadcast),
    Collective("reduce", split=False, reduces=True, bus_factor=_one, prepare=prepare_reduce),
    Collective("all_to_all", split=True, reduces=False, bus_factor=_ring, prepare=prepare_all_to_all),
    Collective("sendrecv", split=False, reduces=False, bus_factor=_one, prepare=prepare_sendrecv),
    Collective("barrier", split=False, reduces=False, bus_factor=_one, prepare=prepare_barrier),
)}
