"""The flight ring kept in a file too, so that a rank killed by a signal still tells what it last called.

A backend that turns a desync into a crash leaves no process to answer on the control plane: gloo aborts
a rank (SIGABRT, "Received data size doesn't match expected size") when one rank's extra `all_reduce` meets
its peer's bucket of another size inside DDP, and MPICH aborts on a truncated message. Under commprof's
launcher every rank therefore also writes its ring into the job folder as it issues each op: a fixed-size
file mapped into memory (`rank<r>.ring`: RING_LENGTH records of seq, bytes and three small ids, each
numbered at both ends), beside `rank<r>.ring.json` naming the ids (groups with their members, op names,
dtypes), rewritten only when a new one appears. The page cache keeps what a killed process wrote, so
whoever judges the failure — the launcher that saw the death, or the claimant whose peer did not answer —
reads the dead rank's last ops and `flight.first_divergence` names the desync (exit 4) rather than the
crash it caused (exit 3).

Only ranks on one host share a job folder: a dead rank on another host stays silent, as before. The cost is
one struct write into shared memory per op (benchmarks/flight_overhead.py measures it).
Exercised by: `pytest tests/unit/test_ring_file.py tests/test_profile_failures.py`.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
from pathlib import Path

from commprof.base.measurement import runs
from commprof.comm.dtypes import dtype_name
from commprof.record.recorder import RING_LENGTH

RECORD = struct.Struct("<QQQHHHxxQ")
"""n (this record's place in the rank's whole history, from 1), seq, bytes, group id, op name id, dtype id (0:
none), n again: one write per op, and a record torn by a kill in the middle of it has two different n's."""
SIZE = RING_LENGTH * RECORD.size
MASK = RING_LENGTH - 1
assert RING_LENGTH & MASK == 0, "the slot of record n is n & MASK"
SUFFIX, TABLES = ".ring", ".ring.json"


def path_of(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}{SUFFIX}"


class FileRing:
    """A rank's ring file, written through `append` (the recorder's `append_ring` once kept) beside the
    recorder's ring in memory."""

    def __init__(self, recorder, folder: Path, rank: int) -> None:
        self._recorder, self._path = recorder, path_of(folder, rank)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._tables: dict[str, list] = {"groups": [], "members": [], "names": [], "dtypes": [None]}
        self.append = self._appender(recorder.ring.append, itertools.count(1).__next__, {})
        for entry in list(recorder.ring):  # what the ring held before it was kept
            self.append(entry, memory=False)

    def _appender(self, remember, number, ids: dict):
        """The per-op function: locals only, one dict lookup and one struct write (0.3 µs; a method reading
        its attributes took twice that)."""
        pack, size, where, get, learn = RECORD.pack_into, RECORD.size, self._map, ids.get, self._learn

        def append(entry: tuple, memory: bool = True) -> None:
            if memory:
                remember(entry)
            label, seq, name, nbytes, dtype = entry
            i = get((label, name, dtype))
            if i is None:
                i = ids[(label, name, dtype)] = learn(label, name, dtype)
            n = number()
            pack(where, (n & MASK) * size, n, seq, nbytes, i[0], i[1], i[2], n)

        return append

    def _learn(self, label: str, name: str, dtype) -> tuple[int, int, int]:
        """Ids for a new (group, op, dtype), the tables file rewritten when it names something new."""
        tables, grown = self._tables, False
        if label not in tables["groups"]:
            comm = next((c for c in self._recorder.comms if c.label == label), None)
            tables["groups"].append(label)
            tables["members"].append(runs(comm.members) if comm is not None else [])
            grown = True
        if name not in tables["names"]:
            tables["names"].append(name)
            grown = True
        kind = dtype_name(dtype) if dtype is not None else None
        if kind not in tables["dtypes"]:
            tables["dtypes"].append(kind)
            grown = True
        if grown:
            temp = self._path.with_name(self._path.name + ".tmp")
            temp.write_text(json.dumps(tables))
            os.replace(temp, self._path.with_suffix(TABLES))
        return tables["groups"].index(label), tables["names"].index(name), tables["dtypes"].index(kind)


def keep(recorder, folder: Path, rank: int) -> None:
    """Write `recorder`'s ring to a file in `folder` (the job folder) too, every Comm already logging into it
    rebound; a folder that cannot hold it leaves the ring in memory alone."""
    if recorder.append_ring != recorder.ring.append:  # kept already
        return
    try:
        ring = FileRing(recorder, folder, rank)
    except (OSError, ValueError):
        return
    recorder.append_ring = ring.append
    for comm in recorder.comms:
        comm._ring = ring.append


def read(folder: Path, ranks=None) -> dict[int, dict]:
    """The snapshots (comm/failure/flight.py's shape) of those of `ranks` (None: every rank) whose ring file is in
    `folder`: their last ops, with no op known to be in progress."""
    if ranks is None:
        ranks = sorted(int(p.name[4:-len(SUFFIX)]) for p in Path(folder).glob(f"rank*{SUFFIX}")
                       if p.name[4:-len(SUFFIX)].isdigit())
    found = {}
    for rank in ranks:
        snap = _read_one(Path(folder), rank)
        if snap is not None:
            found[rank] = snap
    return found


def _read_one(folder: Path, rank: int) -> dict | None:
    try:
        data = path_of(folder, rank).read_bytes()
        tables = json.loads(path_of(folder, rank).with_suffix(TABLES).read_text())
    except (OSError, ValueError):
        return None
    if len(data) != SIZE:
        return None
    try:
        groups, names, dtypes, members = tables["groups"], tables["names"], tables["dtypes"], tables["members"]
    except (KeyError, TypeError):
        return None
    records = sorted(r for r in RECORD.iter_unpack(data) if r[0] and r[0] == r[-1])  # whole ones, oldest first
    ring, seqs = [], {}
    for _n, seq, nbytes, group, name, dtype, _again in records:
        if group >= len(groups) or name >= len(names) or dtype >= len(dtypes):
            continue  # written after the tables were last read
        ring.append([groups[group], seq, names[name], nbytes, dtypes[dtype]])
        seqs[groups[group]] = max(seqs.get(groups[group], 0), seq)
    return {"rank": rank, "reason": "read from its ring file", "busy": None,
            "groups": dict(zip(groups, members)), "seqs": seqs, "ring": ring}
