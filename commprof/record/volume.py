"""Transfer volume: payload bytes handed to collectives and the wire bytes each rank sends, per op type.

payload = bytes in nccl-tests' size convention, exactly as logged by Comm. wire = payload × the
ring algorithm's per-rank send factor (nccl-tests' bus factor; `wire_factor`, commprof/base/measurement.py):
all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n; broadcast, reduce, send, sendrecv 1;
recv 0 (the peer's send counts it). n is the op's group size. Per epoch = per step × steps per epoch.
Ops on a subgroup are counted apart, under "<op> (<group>)", e.g. "all_reduce (dp)" and "send (pp)" on
a 2-D grid. Exercised by: `pytest tests/unit/test_breakdown.py -k volume`.
"""

from __future__ import annotations

from collections import defaultdict

from commprof.base.measurement import wire_factor
from commprof.record.recorder import GROUP, GROUP_SIZE, NAME, NBYTES


def op_key(name: str, group: str) -> str:
    """Volume key of an op: its name, with its group's label unless it ran on the whole world."""
    return name if group == "world" else f"{name} ({group})"


def split_key(key: str) -> tuple[str, str]:
    """(op name, group label) of a volume key."""
    name, _, group = key.partition(" (")
    return name, group.rstrip(")") or "world"


def step_volume(ops: list[tuple]) -> dict[str, dict[str, float]]:
    """Op log entries of one step -> {op key: {"calls", "payload_bytes", "wire_bytes"}}."""
    sums: dict[tuple, list[int]] = {}  # (name, group, its size) -> [calls, payload]: a key and a factor per kind
    for op in ops:                     # of op, not per op (it runs at every profiled step's end)
        got = sums.get((op[NAME], op[GROUP], op[GROUP_SIZE]))
        if got is None:
            sums[op[NAME], op[GROUP], op[GROUP_SIZE]] = [1, op[NBYTES]]
        else:
            got[0] += 1
            got[1] += op[NBYTES]
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
    for (name, group, size), (calls, payload) in sums.items():
        entry = out[op_key(name, group)]
        entry["calls"] += calls
        entry["payload_bytes"] += payload
        entry["wire_bytes"] += payload * wire_factor(name, size)
    return dict(out)


def volume_table(per_step: dict[str, dict], predicted: dict[str, int], *, group_sizes: dict[str, int],
                 steps_per_epoch: int) -> dict[str, dict]:
    """Measured (one step, one rank) next to predicted, per op key, with per-epoch figures.

    `group_sizes`: ranks per group label, for the predicted wire bytes."""
    table = {}
    for name in sorted(set(per_step) | set(predicted)):
        got = per_step.get(name, {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
        pred = predicted.get(name, 0)
        op, group = split_key(name)
        table[name] = {
            "calls_per_step": got["calls"],
            "payload_bytes_per_step": got["payload_bytes"],
            "wire_bytes_per_step": round(got["wire_bytes"]),
            "predicted_payload_bytes_per_step": pred,
            "predicted_wire_bytes_per_step": round(pred * wire_factor(op, group_sizes.get(group, 1))),
            "bytes_per_epoch": got["payload_bytes"] * steps_per_epoch,
            "wire_bytes_per_epoch": round(got["wire_bytes"] * steps_per_epoch),
            "predicted_bytes_per_epoch": pred * steps_per_epoch,
        }
    return table
