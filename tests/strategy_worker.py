"""One rank of the strategy test: train each strategy K steps on this world, and on rank 0 the same
steps with `single` on the whole global batch; exit 1 unless every strategy ends with the parameters
of `single` and its measured payload per step equals its prediction.

    python tests/strategy_worker.py '{"backend": "gloo", "strategies": ["ddp"], "model": "mnist-cnn"}'

Started by tests/test_strategies.py as N real processes (gloo) or under mpiexec (MPI).
"""

import json
import sys

import torch

from commprof.base.world import discover
from commprof.comm import end_process, init_comm
from commprof.record.step_figures import mean_volume
from commprof.run.config import RunConfig
from commprof.run.loop import train


def main(spec: dict) -> int:
    comm = init_comm(discover(), backend=spec["backend"], timeout_s=120)
    k = comm.world_size
    base = dict(model=spec["model"], backend=spec["backend"], batch_size=spec.get("batch", 4),
                steps=spec.get("steps", 3), warmup=0, seed=3, lr=spec.get("lr", 0.05), eval_samples=0,
                save_state="(in memory)", samples=256, seq_len=16, bucket_mb=spec.get("bucket_mb", 0.01),
                bucket_mb_given=True, optimizer=spec.get("optimizer", "sgd"),
                grad_accum=spec.get("grad_accum", 1), frozen_backbone=spec.get("frozen", False),
                prefetch=spec.get("prefetch", True), checkpoint=spec.get("checkpoint", False),
                **{key: tuple(v) if isinstance(v, list) else v for key, v in spec.get("extra", {}).items()})
    reference = None
    if comm.rank == 0:
        replicas = spec.get("replicas", k)  # model-parallel ranks share one shard of the global batch
        single = RunConfig(strategy="single", **{**base, "batch_size": base["batch_size"] * replicas})
        _, reference = train(single, None, torch.device("cpu"))
    failures = []
    for name in spec["strategies"]:
        result, state = train(RunConfig(strategy=name, **base), comm, torch.device("cpu"))
        # torch's pipelining exchanges its stages' tensor metadata in its first step (4 B each way, measured):
        # set-up, not the schedule's traffic, which every later step repeats
        steps = result["volume_steps"][1:] if name.startswith("torch-pipeline") else result["volume_steps"]
        if name == "torch-ddp":  # DDP's reducer broadcasts its bucket order once, at the second step's forward
            steps = steps[:1] + steps[2:]
        measured = {op: v["payload_bytes"] for op, v in mean_volume(steps).items()}
        every = comm.gather_object((measured, result["predicted"]), dst=0)  # each rank's own volume
        if comm.rank != 0:
            continue
        worst = max(float((state[key].float() - value.float()).abs().max())
                    for key, value in reference.items())
        ok_params = worst <= spec.get("atol", 2e-5)
        ok_volume = all(got == want for got, want in every)
        print(json.dumps({"strategy": name, "world_size": k, "max_abs_diff": worst, "measured": measured,
                          "predicted": result["predicted"], "losses": result["losses"],
                          "measured_by_rank": [got for got, _ in every], "pipeline": result["pipeline"],
                          "held_bytes": result["held_bytes"]}), flush=True)
        if not (ok_params and ok_volume):
            failures.append(name)
    comm.control_barrier()
    comm.close()
    if failures:
        print(f"FAILED: {failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    end_process(main(json.loads(sys.argv[1])))  # not sys.exit: see commprof.comm.end_process
