"""tests/strategy_worker.py's check, run in process on a FakeWorld (fake_comm.py): every strategy trained K steps
on each rank, `single` on the whole global batch, and one row per strategy as the worker prints it
(max_abs_diff to single's parameters, each rank's measured payload per step, the prediction, the pipeline
figures, held bytes). The fast lane's model tests (tests/unit/test_fake_comm_models.py) read these rows as the
job tests read the worker's.

Ranks build one at a time and none trains before all have built: loop.build seeds torch's global generator,
which the threads share (test_fake_comm_strategies.py says when that mattered).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from support.fake_comm import FakeWorld

from commprof.record.step_figures import mean_volume
from commprof.run import loop
from commprof.run.config import RunConfig

_BUILD = threading.Lock()


def worker_rows(nproc: int, **spec) -> list[dict]:
    """The rows tests/strategy_worker.py prints for `spec` (its keys), computed on `nproc` fake ranks; raises
    AssertionError where the worker would exit 1 (parameters beyond atol, a rank's volume off its prediction)."""
    base = dict(model=spec["model"], backend="gloo", batch_size=spec.get("batch", 4), steps=spec.get("steps", 3),
                warmup=0, seed=3, lr=spec.get("lr", 0.05), eval_samples=0, save_state="(in memory)", samples=256,
                seq_len=16, bucket_mb=spec.get("bucket_mb", 0.01), bucket_mb_given=True,
                optimizer=spec.get("optimizer", "sgd"), grad_accum=spec.get("grad_accum", 1),
                frozen_backbone=spec.get("frozen", False), prefetch=spec.get("prefetch", True),
                checkpoint=spec.get("checkpoint", False),
                **{key: tuple(v) if isinstance(v, list) else v for key, v in spec.get("extra", {}).items()})
    replicas = spec.get("replicas", nproc)
    single = RunConfig(strategy="single", **{**base, "batch_size": base["batch_size"] * replicas})
    reference = loop.train(single, None, torch.device("cpu"))[1]
    rows = []
    for name in spec["strategies"]:
        rows.append(_row(name, RunConfig(strategy=name, **base), nproc, reference, spec.get("atol", 2e-5)))
    return rows


@contextmanager
def one_build_at_a_time(world_size: int, timeout_s: float):
    """loop.build, for the block, one rank at a time, and no rank on to training before all have built."""
    built = threading.Barrier(world_size, timeout=timeout_s)
    build = loop.build

    def serial(config):
        with _BUILD:
            try:
                made = build(config)
            except BaseException:
                built.abort()  # the peers waiting below fail at once
                raise
        built.wait()
        return made

    loop.build = serial
    try:
        yield
    finally:
        loop.build = build


def _row(name: str, cfg: RunConfig, nproc: int, reference: dict, atol: float) -> dict:
    world = FakeWorld(nproc)
    with one_build_at_a_time(nproc, world.timeout_s):
        ranks = world.run(lambda comm: loop.train(cfg, comm, torch.device("cpu")))
    result, state = ranks[0]
    every = [({op: v["payload_bytes"] for op, v in mean_volume(r["volume_steps"]).items()}, r["predicted"])
             for r, _ in ranks]
    worst = max(float((state[key].float() - value.float()).abs().max()) for key, value in reference.items())
    assert worst <= atol, f"{name}: parameters differ from single's by up to {worst:g}"
    assert all(got == want for got, want in every), f"{name}: a rank's volume is off its prediction: {every}"
    return {"strategy": name, "world_size": nproc, "max_abs_diff": worst, "measured": every[0][0],
            "predicted": result["predicted"], "losses": result["losses"],
            "measured_by_rank": [got for got, _ in every], "pipeline": result["pipeline"],
            "held_bytes": result["held_bytes"]}
