"""Every strategy built on Comm, trained in process on a FakeWorld (tests/support/fake_comm.py): per step and
rank, the ops its Comm logged (name, group, payload bytes — comm/base.py's own log) equal the strategy's
closed form written out below, and so do the volume's payload and wire bytes (record/volume.py) and the
strategy's own prediction; after the steps its parameters equal `single` trained on the same global batch
(the project rule, tests/test_strategies.py's 2e-5).

Each rank runs `commprof.run.loop.train` — the run command's own loop, which builds the strategy with
CATALOG[name].load()(spec=, comm=, config=) — on a thread of its own. loop.build seeds torch's global
generator, which the threads share: ranks build one at a time, and none trains before all have built
(torch.utils.checkpoint's recompute resets that generator: a rank recomputing while a peer drew its
weights gave the peer other weights, 1 run in 10 of gpt2-tiny with --checkpoint --grad-accum 2).
The multi-rank jobs (tests/test_strategies.py, test_pipeline.py, test_tensor.py) still check the real
backends; torch-ddp, torch-fsdp and torch-pipeline-* run on torch's own process groups, not on Comm, and
stay there. Model: mnist-cnn (21,840 parameters; its four layers are its FSDP units and its pipeline chain).

    pytest tests/unit/test_fake_comm_strategies.py
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
import torch
from support.fake_comm import FakeWorld
from support.fake_worker import one_build_at_a_time

from commprof.record.recorder import GROUP, NAME, NBYTES
from commprof.run import loop
from commprof.run.config import RunConfig

BASE = dict(model="mnist-cnn", backend="gloo", batch_size=4, steps=2, warmup=0, seed=3, lr=0.05, eval_samples=0,
            save_state="(in memory)", samples=64, bucket_mb=0.01, bucket_mb_given=True, micro_batches=2)
"""tests/strategy_worker.py's settings: several DDP buckets (10 KiB), every step a new batch."""
ATOL = 2e-5
F32 = 4


def train_ranks(world_size: int, strategy: str, **overrides) -> list[tuple[dict, dict, list]]:
    """(result, final state, [ops of each step as (name, group, bytes)]) of every rank."""
    cfg = RunConfig(strategy=strategy, **{**BASE, **overrides})
    world = FakeWorld(world_size)

    def rank(comm):
        steps = []  # on_step runs after each step, before train() clears the op log for the next
        result, state = loop.train(cfg, comm, torch.device("cpu"), on_step=lambda _: steps.append(
            [(op[NAME], op[GROUP], op[NBYTES]) for op in comm.recorder.ops]))
        return result, state, steps
    with one_build_at_a_time(world_size, world.timeout_s):
        return world.run(rank)


@cache
def single(global_batch: int, grad_accum: int = 1) -> dict:
    """The reference: one process, no Comm, the whole global batch."""
    cfg = RunConfig(strategy="single", **{**BASE, "batch_size": global_batch, "grad_accum": grad_accum})
    return loop.train(cfg, None, torch.device("cpu"))[1]


@cache
def model():
    """(source, spec) of BASE, built as every rank builds it (the closed forms read its shapes)."""
    return loop.build(RunConfig(strategy="single", **BASE))


def param_numels() -> list[int]:
    return [p.numel() for p in model()[1].module.parameters()]


def padded(numel: int, k: int) -> int:
    """Bytes of a flat fp32 vector padded to k equal shards (parallel/flat.py's layout)."""
    return -(-numel // k) * k * F32


def assert_same_params(state: dict, reference: dict) -> None:
    assert state.keys() == reference.keys()
    worst = max(float((state[key] - value).abs().max()) for key, value in reference.items())
    assert worst <= ATOL, f"parameters differ from single's by up to {worst:g}"


WIRE = {"all_reduce": lambda k: 2 * (k - 1) / k, "all_gather": lambda k: (k - 1) / k,
        "reduce_scatter": lambda k: (k - 1) / k, "send": lambda k: 1.0, "recv": lambda k: 0.0}
"""Bytes a rank sends per payload byte, ring algorithms (docs: commprof/record/volume.py's docstring)."""


def assert_volume(result: dict, ops: Counter, sizes: dict) -> None:
    """Every step's volume table (payload and wire) and the strategy's prediction equal the closed form `ops`."""
    payload, wire = Counter(), Counter()
    for (name, group, nbytes), calls in ops.items():
        key = name if group == "world" else f"{name} ({group})"
        payload[key] += calls * nbytes
        wire[key] += calls * nbytes * WIRE[name](sizes[group])
    assert result["predicted"] == dict(payload)
    for step in result["volume_steps"]:
        assert {key: v["payload_bytes"] for key, v in step.items()} == dict(payload)
        assert {key: v["wire_bytes"] for key, v in step.items()} == pytest.approx(dict(wire))


# ---- data parallel: every rank the same ops, every rank single's parameters -------------------------
def ddp_buckets(cap_bytes: int) -> list[int]:
    """DistributedDataParallel's bucketing: parameters in reverse registration order, a bucket closed before
    the tensor that would take it past the cap (a bigger tensor alone)."""
    buckets, size = [], 0
    for numel in reversed(param_numels()):
        if size and size + numel * F32 > cap_bytes:
            buckets.append(size)
            size = 0
        size += numel * F32
    return [*buckets, size]


def data_parallel(strategy: str, k: int, accum: int) -> tuple[list | None, Counter]:
    """(the exact op sequence of a step where it is fixed, else None; the ops as a multiset)."""
    numels, total = param_numels(), sum(param_numels())
    if strategy == "single":
        seq = []
    elif strategy == "naive-dp":  # one all_reduce per parameter, registration order (strategies/naive_dp.py)
        seq = [("all_reduce", "world", n * F32) for n in numels]
    elif strategy in ("ddp", "mpi-dp"):  # buckets complete in autograd's order: only the multiset is fixed
        cap = int((BASE["bucket_mb"] if strategy == "ddp" else 64) * 2 ** 20)  # mpi-dp: Horovod's 64 MiB
        return None, Counter(("all_reduce", "world", b) for b in ddp_buckets(cap))
    elif strategy == "zero1":  # the flat gradient all-reduced, the stepped shards all-gathered
        seq = [("all_reduce", "world", padded(total, k)), ("all_gather", "world", padded(total, k))]
    elif strategy == "zero2":  # reduce-scattered instead: one all_reduce's wire bytes in all
        seq = [("reduce_scatter", "world", padded(total, k)), ("all_gather", "world", padded(total, k))]
    else:  # fsdp, every layer a unit and no root: per micro-batch each unit gathered in forward and in
        units = [padded(n, k) for n in _unit_numels()]  # backward, its gradient reduce-scattered once
        forward = [("all_gather", "world", u) for u in units]
        ops = Counter(forward * 2 * accum) + Counter(("reduce_scatter", "world", u) for u in units * accum)
        return forward, ops  # the forward's gathers are the step's first ops, in unit order
    return seq, Counter(seq)


def _unit_numels() -> list[int]:
    return [sum(p.numel() for p in unit.parameters()) for unit in model()[1].units]


DP_CASES = [("single", 1, 1)] + [(s, k, 1) for s in ("naive-dp", "ddp", "zero1", "zero2", "fsdp") for k in (2, 4)] + [
    ("mpi-dp", 2, 1), ("ddp", 2, 2), ("fsdp", 2, 2), ("zero2", 4, 2)]


@pytest.mark.parametrize("strategy,k,accum", DP_CASES, ids=[f"{s}-{k}ranks-accum{a}" for s, k, a in DP_CASES])
def test_data_parallel_ops_bytes_and_parameters(strategy, k, accum):
    extra = {"bucket_mb_given": False} if strategy == "mpi-dp" else {}
    ranks = train_ranks(k, strategy, grad_accum=accum, **extra)
    seq, ops = data_parallel(strategy, k, accum)
    reference = single(BASE["batch_size"] * k, accum)
    for r, (result, state, steps) in enumerate(ranks):
        assert len(steps) == BASE["steps"]
        for t, step in enumerate(steps):
            assert Counter(step) == ops, f"rank {r} step {t}"
            if seq is not None:
                assert step[:len(seq)] == seq, f"rank {r} step {t}"
        assert_volume(result, ops, {"world": k})
        assert_same_params(state, reference)  # each rank holds (or gathers) the whole model


def test_ddp_sends_every_gradient_byte_once_in_several_buckets():
    """The brief's DDP closed form, spelled out: all_reduce payload = the gradient bytes, wire 2(k−1)/k of it."""
    buckets = ddp_buckets(int(BASE["bucket_mb"] * 2 ** 20))
    assert sum(buckets) == 21840 * F32 and len(buckets) > 2  # mnist-cnn, as tests/test_strategies.py counts it
    result = train_ranks(4, "ddp")[0][0]
    assert result["volume_steps"][0]["all_reduce"]["wire_bytes"] == pytest.approx(2 * 3 / 4 * 21840 * F32)


# ---- model parallel: each rank its own slice of the closed form -----------------------------------
def schedule(name: str, m: int, p: int, s: int) -> list[str]:
    """Stage s's actions ("F"/"B") under GPipe (all forwards, then all backwards) or 1F1B (p−s−1 warm-up
    forwards, then one forward one backward, then the rest): parallel/schedule.py's docstring."""
    if name == "pipeline-gpipe":
        return ["F"] * m + ["B"] * m
    warm = min(p - s - 1, m)
    return ["F"] * warm + ["F", "B"] * (m - warm) + ["B"] * warm


def boundary_bytes(micro: int) -> list[int]:
    """Bytes of the activation after each layer of the chain for one micro-batch (a cut's traffic each way)."""
    source, spec = model()
    h, out = torch.zeros(micro, source.in_channels, source.image_size, source.image_size), []
    with torch.no_grad():
        for layer in spec.layers:
            h = layer(h)
            out.append(h.numel() * h.element_size())
    return out


PIPE_CASES = [(s, k, dp) for s in ("pipeline-gpipe", "pipeline-1f1b") for k, dp in ((2, 1), (4, 1), (4, 2))]


@pytest.mark.parametrize("strategy,k,dp", PIPE_CASES, ids=[f"{s}-{k}ranks-dp{d}" for s, k, d in PIPE_CASES])
def test_pipeline_ops_bytes_and_parameters(strategy, k, dp):
    p, m = k // dp, BASE["micro_batches"]
    cuts = {2: (2,), 4: (1, 2, 3)}[p]  # explicit: the partition is not what is tested here
    starts = [0, *cuts]
    act = boundary_bytes(BASE["batch_size"] // m)
    ranks = train_ranks(k, strategy, dp=dp, pp=p, cuts=cuts)
    numels = [sum(q.numel() for q in layer.parameters()) for layer in model()[1].layers]
    for r, (result, state, steps) in enumerate(ranks):
        s = r % p
        into, out = f"pp {s - 1}→{s}", f"pp {s}→{s + 1}"
        ops = Counter()
        if s > 0:  # activation in, its gradient back (every stage trains: every boundary carries one)
            ops += Counter({("recv", into, act[starts[s] - 1]): m, ("send", into, act[starts[s] - 1]): m})
        if s < p - 1:
            ops += Counter({("send", out, act[starts[s + 1] - 1]): m, ("recv", out, act[starts[s + 1] - 1]): m})
        if dp > 1:  # the stage's gradients averaged over the replicas, one flat all_reduce
            ops[("all_reduce", "dp", sum(numels[starts[s]:([*starts, len(numels)])[s + 1]]) * F32)] = 1
        recvs = [into if a == "F" else out for a in schedule(strategy, m, p, s)
                 if (a == "F" and s > 0) or (a == "B" and s < p - 1)]
        for step in steps:
            assert Counter(step) == ops, f"rank {r}"
            assert [g for name, g, _ in step if name == "recv"] == recvs, f"rank {r}: receives out of schedule"
        sizes = {"world": k, "dp": dp, **{f"pp {b}→{b + 1}": 2 for b in range(p - 1)}}
        assert_volume(result, ops, sizes)
    assert_same_params(ranks[0][1], single(BASE["batch_size"] * dp))  # rank 0 gathers the stages


@pytest.mark.parametrize("k,dp", [(2, 1), (4, 2)], ids=["tp2", "dp2xtp2"])
def test_tensor_parallel_ops_bytes_and_parameters(k, dp):
    t, batch = k // dp, BASE["batch_size"]
    fc1, fc2 = model()[1].head  # mnist-cnn's head: fc1 column-parallel, fc2 row-parallel (strategies/tensor.py)
    ranks = train_ranks(k, "tensor", dp=dp, tp=t)
    # per sample: fc2's partial outputs summed forward; fc1's input gradient summed backward (the convs
    # below it train)
    seq = [("all_reduce", "tp", batch * fc2.out_features * F32), ("all_reduce", "tp", batch * fc1.in_features * F32)]
    if dp > 1:  # this rank's parameters: the convs whole, fc1's rows and fc2's columns of its slice, fc2's bias
        mine = sum(param_numels()[:4]) + (fc1.weight.numel() + fc1.out_features) // t
        mine += fc2.weight.numel() // t + fc2.out_features
        seq.append(("all_reduce", "dp", mine * F32))
    for r, (result, state, steps) in enumerate(ranks):
        for step in steps:
            assert step == seq, f"rank {r}"
        assert_volume(result, Counter(seq), {"world": k, "tp": t, "dp": dp})
    assert_same_params(ranks[0][1], single(batch * dp))  # rank 0 joins replica 0's slices


# ---- the variants tests/strategy_worker.py once ran as jobs: parameters, and volume against prediction -------
VARIANTS = {
    "transformer, accumulation, checkpointing": (("naive-dp", "ddp", "zero1", "zero2", "fsdp"),
                                                 dict(model="gpt2-tiny", grad_accum=2, checkpoint=True,
                                                      seq_len=16, samples=256), ATOL),
    "frozen backbone, fsdp without prefetch": (("ddp", "fsdp"), dict(model="squeezenet1_0", frozen_backbone=True,
                                                                      prefetch=False, batch_size=2, lr=0.01), ATOL),
    "sharded adam": (("ddp", "zero2", "fsdp"), dict(optimizer="adam", lr=1e-3), 1e-4),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_match_single_and_their_prediction(variant):
    strategies, overrides, atol = VARIANTS[variant]
    k = 2
    settings = {**BASE, **overrides}
    reference = loop.train(RunConfig(strategy="single", **{**settings, "batch_size": settings["batch_size"] * k}),
                           None, torch.device("cpu"))[1]
    for strategy in strategies:
        for result, state, _ in train_ranks(k, strategy, **overrides):
            worst = max(float((state[key] - value).abs().max()) for key, value in reference.items())
            assert worst <= atol, f"{strategy}: parameters differ from single's by up to {worst:g}"
            for step in result["volume_steps"]:
                assert {key: v["payload_bytes"] for key, v in step.items()} == result["predicted"], strategy
