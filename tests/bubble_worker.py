"""One rank of the calibrated pipeline: p stages whose forward sleeps F ms and backward B ms per
micro-batch, so the ideal GPipe/1F1B bubble is exactly (p − 1) / (m + p − 1). Rank 0 prints, per
schedule and micro-batch count, each stage's measured bubble fraction (median over steps) next to that prediction.

    python tests/bubble_worker.py '{"schedules": ["pipeline-gpipe"], "micro_batches": [4, 8]}'

"last_stage_layers": N gives the last stage N layers (unequal stages); each line then also holds every
stage's median bubble and schedule (ms).

Started by tests/test_pipeline.py as 4 real gloo processes (see commprof.run.calibrated).
"""

import json
import sys

import numpy as np

from commprof.base.world import discover
from commprof.comm import end_process, init_comm
from commprof.run.calibrated import calibrated_bubble


def main(spec: dict) -> int:
    comm = init_comm(discover(), backend="gloo", timeout_s=120)
    p = comm.world_size
    for schedule in spec["schedules"]:
        for m in spec["micro_batches"]:
            steps = calibrated_bubble(comm, schedule, micro_batches=m, fwd_ms=20, bwd_ms=40,
                                      last_stage_layers=spec.get("last_stage_layers", 1))
            mine = {k: float(np.median([s[k] for s in steps])) for k in ("fraction", "bubble_ms", "schedule_ms")}
            every = comm.gather_object(mine, dst=0)
            if comm.rank == 0:
                print(json.dumps({"schedule": schedule, "micro_batches": m, "stages": p,
                                  "measured": [e["fraction"] for e in every],
                                  "bubble_ms": [e["bubble_ms"] for e in every],
                                  "schedule_ms": [e["schedule_ms"] for e in every],
                                  "predicted": (p - 1) / (m + p - 1)}), flush=True)
    comm.control_barrier()
    comm.close()
    return 0


if __name__ == "__main__":
    end_process(main(json.loads(sys.argv[1])))  # not sys.exit: see commprof.comm.end_process
