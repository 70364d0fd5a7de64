"""A rank's flight record in the dump format of PyTorch's own flight recorder, for torch's analyser of it.

`flight.dump` writes each rank's snapshot as `rank<r>.flight.json`; beside it this module writes the same
snapshot as `fr_trace_rank_<r>`: a pickle laid out as torch 2.14's flight recorder dumps it (version 2.10,
`pg_config`, `pg_status`, `entries`), which `torch.distributed.flight_recorder.fr_trace` loads, matches
across ranks by process group and collective seq, and reports the first mismatch of:

    python -m torch.distributed.flight_recorder.fr_trace DIR -p fr_trace_rank_

(`-p`: fr_trace takes every file of DIR, and of the folders under it, whose name holds the prefix, and
infers the prefix only when no other file's name ends in digits.) Each ring entry [group, seq, op, bytes,
dtype] becomes one entry: the group its process group (name = commprof's label, ranks from the snapshot's
groups), seq its collective_seq_id, the op `<backend>:<op>` as torch's gloo backend records it, bytes and
dtype its input and output sizes in elements and dtypes by torch's ScalarType names. What commprof's ring
does not hold is filled so that fr_trace compares only what it does: no stack frames, no timestamps (0),
every entry "scheduled" (the ring records an op when issued, as gloo's recorder does, never its completion),
and point-to-point ops left out (the ring has no peer, which fr_trace's send/recv names need; torch's gloo
recorder keeps none either, and commprof never compares them).
Exercised by: `pytest tests/unit/test_fr_dump.py` and `pytest tests/test_profile_failures.py -k fr_trace`.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from commprof.base.measurement import P2P

PREFIX = "fr_trace_rank_"
"""File name before the rank: fr_trace's `-p`. Nothing else commprof writes holds it or ends in digits, so fr_trace
also infers it in a folder of commprof's alone."""
VERSION = "2.10"
"""The dump format torch 2.14 writes, gloo's and NCCL's; fr_trace picks its matching rules by it."""
BACKENDS = ("nccl", "gloo")
"""Profiling-name prefixes written: the job's torch backend, else "nccl" (fr_trace knows no MPI; the prefix
only labels its output, it matches on the op after the colon)."""

DTYPES = {"float32": ("Float", 4), "float64": ("Double", 8), "float16": ("Half", 2), "bfloat16": ("BFloat16", 2),
          "int64": ("Long", 8), "int32": ("Int", 4), "int16": ("Short", 2), "int8": ("Char", 1),
          "uint8": ("Byte", 1), "bool": ("Bool", 1), "complex64": ("ComplexFloat", 8),
          "complex128": ("ComplexDouble", 16), "float8_e4m3fn": ("Float8_e4m3fn", 1),
          "float8_e5m2": ("Float8_e5m2", 1), "uint16": ("UInt16", 2), "uint32": ("UInt32", 4),
          "uint64": ("UInt64", 8)}
"""commprof's dtype name (torch's, less `torch.`) -> (the ScalarType name torch's recorder writes, bytes an
element). Another dtype is counted in bytes ("Byte"): the same on every rank, so still compared."""

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
"""commprof's collective op names, each also the name torch's gloo recorder gives it (`gloo:all_reduce`,
`gloo:all_gather`, `gloo:all_to_all`, `gloo:barrier`…) and one fr_trace knows. Any other op is left out:
fr_trace stops on a name it does not know."""


def path_of(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"{PREFIX}{rank}"


def write(folder: str | Path, snap: dict, backend: str | None = None) -> Path:
    """Write `snap` (comm/failure/flight.py's snapshot shape) as FOLDER/fr_trace_rank_<r>: a temp file, then a rename,
    so fr_trace never reads half a pickle. Raises what writing or an odd snapshot raises: flight.dump swallows it."""
    path = path_of(folder, snap["rank"])
    data = pickle.dumps(record(snap, backend or backend_in_use()), protocol=4)
    # the temp name holds neither the prefix nor a final digit: fr_trace would try to load one left by a kill
    temp = path.with_name(f".rank{snap['rank']}.fr.{os.getpid()}.tmp")
    try:
        temp.write_bytes(data)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def record(snap: dict, backend: str = "nccl") -> dict:
    """The dump torch's flight recorder would have written for this rank: plain data, pickled by `write`."""
    rank = snap["rank"]
    groups = {label: expand(members) for label, members in snap["groups"].items()}
    for label, *_ in snap["ring"]:  # a group named only in the ring (a snapshot read from a ring file)
        groups.setdefault(label, [])
    mine = {label for label, members in groups.items() if rank in members}
    pg_ids = {label: i for i, label in enumerate(groups)}
    entries = []
    for record_id, (label, seq, name, nbytes, dtype) in collectives(snap):
        if name not in COLLECTIVES or label not in mine:
            continue  # a name fr_trace rejects, or a group whose members are unknown: its matching would fail
        inputs, outputs, kinds = sizes(name, nbytes, dtype, len(groups[label]))
        entries.append({
            "record_id": record_id, "pg_id": pg_ids[label], "process_group": (label, describe(label)),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"{backend}:{name}",
            "time_created_ns": 0, "input_sizes": inputs, "input_dtypes": kinds, "output_sizes": outputs,
            "output_dtypes": kinds, "state": "scheduled", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "is_p2p": False, "frames": []})
    return {
        "version": VERSION, "comm_lib_version": "",
        # ranks as a string of a list, as torch writes them (fr_trace parses it with ast.literal_eval)
        "pg_config": {label: {"name": label, "desc": describe(label), "ranks": str(members)}
                      for label, members in groups.items() if label in mine},
        "pg_status": {str(pg_ids[label]): {"last_enqueued_collective": snap["seqs"].get(label, 0),
                                           "last_started_collective": -1, "last_completed_collective": -1}
                      for label in groups},
        "entries": entries,
    }


def collectives(snap: dict):
    """(record_id, ring entry) for every collective of the ring, oldest first. The record id counts the
    collectives this rank issued, every group's together: fr_trace drops each rank's entries older than the
    latest first id of any rank, so ids must agree across ranks that issued the same — the ring's place would
    not once it has wrapped (ranks hold different windows) and a rank's extra op shifts it."""
    ring = [entry for entry in snap["ring"] if entry[2] not in P2P]
    # each group's seq just before the ring's window opens: a collective's own seq less one, or where it stands
    before = {label: seq for label, seq in snap["seqs"].items()}
    for label, seq, *_ in reversed(ring):
        before[label] = seq - 1
    total = sum(before.values())
    done = dict(before)
    for entry in ring:
        label, seq = entry[0], entry[1]
        total += seq - done[label]  # one more, unless the ring skipped some (a record torn by a kill)
        done[label] = seq
        yield total - 1, entry


def sizes(name: str, nbytes: int, dtype: str | None, size: int) -> tuple[list, list, list]:
    """(input sizes, output sizes, dtypes) of one op as torch records them: element counts, one list per
    tensor. commprof's bytes are all_gather's output and reduce_scatter's input, the whole buffer."""
    if dtype is None and not nbytes:
        return [], [], []  # a barrier: torch's gloo recorder writes no tensor
    kind, width = DTYPES.get(dtype or "", ("Byte", 1))
    n, size = nbytes // width, max(size, 1)
    if name == "all_gather":  # torch's gloo: input [[n]], output [[group size, n]]
        return [[n // size]], [[size, n // size]], [kind]
    if name == "reduce_scatter":
        return [[n]], [[n // size]], [kind]
    return [[n]], [[n]], [kind]


def describe(label: str) -> str:
    """A group's description: torch's name for the world group, "undefined" (its default) for the others."""
    return "default_pg" if label == "world" else "undefined"


def expand(members: list) -> list[int]:
    """A snapshot's members — global ranks, or runs [first, last] (a ring file's) — as the global ranks."""
    if members and isinstance(members[0], list | tuple):
        return [r for first, last in members for r in range(first, last + 1)]
    return [int(r) for r in members]


def backend_in_use() -> str:
    """The job's torch backend, read off torch.distributed's default group if one exists (the dead rank's
    snapshot, read from its ring file, is dumped by a peer of the same job): "gloo" or "nccl"."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            name = str(dist.get_backend()).lower()  # "gloo", "nccl", or "cpu:gloo,cuda:nccl"
            return next((b for b in BACKENDS if b in name), BACKENDS[0])
    except Exception:  # a group being torn down: the default name
        pass
    return BACKENDS[0]
