"""The collectives `commprof bench` measures, each filling the same small interface (as nccl-tests does):

  split        the reported size is world_size × per-rank count (all_gather, reduce_scatter, all_to_all)
  bus_factor   busbw = algbw × bus_factor(n), nccl-tests' factors
  prepare      buffers for one (count, dtype, op, mode) -> a Case: run(), init(), wrong()

`count` is always the element count of the reported size. The names, their order, split, reduces and
the bus factors are the measurement model (commprof/base/measurement.py); this module adds `prepare`. Adding
a collective means one line there and one `prepare_*` function here, in PREPARE. Exercised by:
`pytest tests/test_data_world.py tests/test_bench_cli.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import Callable

import torch

from commprof.base import measurement
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
class Collective(measurement.CollectiveModel):
    """A collective's model and how bench prepares one measurement of it."""

    prepare: Callable[..., Case]


def _fill(t: torch.Tensor, values: torch.Tensor) -> None:
    t.copy_(values.to(t.dtype))


def prepare_all_reduce(comm, count, dtype, op, inplace, root):
    n, dev = comm.world_size, comm.device
    src = torch.empty(count, dtype=dtype, device=dev)
    out = None if inplace else torch.empty_like(src)
    expected = cache(lambda: data.reduce_expected(op, n, count))
    return Case(run=partial(comm.all_reduce, src, op=op, output=out),
                init=lambda: _fill(src, data.reduce_input(op, comm.rank, n, count)),
                wrong=lambda: data.count_wrong(src if inplace else out, expected(), n=n, approx=op == "avg"),
                output=src if inplace else out)


def prepare_all_gather(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    out = torch.empty(count, dtype=dtype, device=dev)
    inp = out[r * chunk:(r + 1) * chunk] if inplace else torch.empty(chunk, dtype=dtype, device=dev)
    expected = cache(lambda: torch.cat([data.pattern(s, chunk) for s in range(n)]))

    def init():
        out.fill_(data.SENTINEL)
        _fill(inp, data.pattern(r, chunk))

    return Case(run=partial(comm.all_gather, out, inp), init=init,
                wrong=lambda: data.count_wrong(out, expected(), n=n, approx=False), output=out)


def prepare_reduce_scatter(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    inp = torch.empty(count, dtype=dtype, device=dev)
    out = inp[r * chunk:(r + 1) * chunk] if inplace else torch.empty(chunk, dtype=dtype, device=dev)
    expected = cache(lambda: data.reduce_expected(op, n, chunk, offset=r * chunk))
    return Case(run=partial(comm.reduce_scatter, out, inp, op=op),
                init=lambda: _fill(inp, data.reduce_input(op, r, n, count)),
                wrong=lambda: data.count_wrong(out, expected(), n=n, approx=op == "avg"), output=out)


def prepare_broadcast(comm, count, dtype, op, inplace, root):
    r, buf = comm.rank, torch.empty(count, dtype=dtype, device=comm.device)
    expected = cache(lambda: data.pattern(root, count))

    def init():
        if r == root:
            _fill(buf, expected())
        else:
            buf.fill_(data.SENTINEL)

    return Case(run=partial(comm.broadcast, buf, src=root), init=init,
                wrong=lambda: data.count_wrong(buf, expected(), n=comm.world_size, approx=False), output=buf)


def prepare_reduce(comm, count, dtype, op, inplace, root):
    n, r, dev = comm.world_size, comm.rank, comm.device
    src = torch.empty(count, dtype=dtype, device=dev)
    out = None if inplace else torch.empty_like(src)
    expected = cache(lambda: data.reduce_expected(op, n, count))

    def wrong():
        if r != root:
            return 0  # only the root's buffer is defined afterwards
        return data.count_wrong(src if inplace else out, expected(), n=n, approx=op == "avg")

    return Case(run=partial(comm.reduce, src, dst=root, op=op, output=out),
                init=lambda: _fill(src, data.reduce_input(op, r, n, count)), wrong=wrong,
                output=src if inplace else out)


def prepare_all_to_all(comm, count, dtype, op, inplace, root):
    n, r, dev, chunk = comm.world_size, comm.rank, comm.device, count // comm.world_size
    inp = torch.empty(count, dtype=dtype, device=dev)
    out = inp if inplace else torch.empty_like(inp)
    expected = cache(lambda: data.all_to_all_expected(r, n, chunk))
    return Case(run=partial(comm.all_to_all, out, inp),
                init=lambda: _fill(inp, data.all_to_all_input(r, n, chunk)),
                wrong=lambda: data.count_wrong(out, expected(), n=n, approx=False), output=out)


def prepare_sendrecv(comm, count, dtype, op, inplace, root):
    n, r, dev = comm.world_size, comm.rank, comm.device
    send = torch.empty(count, dtype=dtype, device=dev)
    recv = torch.empty(count, dtype=dtype, device=dev)
    expected = cache(lambda: data.pattern((r - 1) % n, count))

    def init():
        _fill(send, data.pattern(r, count))
        recv.fill_(data.SENTINEL)

    return Case(run=partial(comm.sendrecv, send, recv, dst=(r + 1) % n, src=(r - 1) % n), init=init,
                wrong=lambda: data.count_wrong(recv, expected(), n=n, approx=False), output=recv)


def prepare_barrier(comm, count, dtype, op, inplace, root):
    return Case(run=comm.barrier, init=lambda: None, wrong=lambda: 0)


PREPARE: dict[str, Callable[..., Case]] = {
    "all_reduce": prepare_all_reduce, "all_gather": prepare_all_gather, "reduce_scatter": prepare_reduce_scatter,
    "broadcast": prepare_broadcast, "reduce": prepare_reduce, "all_to_all": prepare_all_to_all,
    "sendrecv": prepare_sendrecv, "barrier": prepare_barrier,
}

COLLECTIVES: dict[str, Collective] = {name: Collective(**vars(model), prepare=PREPARE[name])
                                      for name, model in measurement.COLLECTIVES.items()}
"""In the measurement model's order: the order of the sweep and of the tables."""
