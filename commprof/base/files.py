"""JSON and CSV reports, written atomically: a temp file in the same folder, fsync, then rename, so a
killed run leaves either the previous complete file or the new one, never half a file. Only a regular file
(or a new path) is replaced so: a device, a FIFO or a socket (/dev/null, /dev/stdout, a named pipe) is
written through, and a symlink is followed to the file it names. A written file gets the mode an ordinary
`open()` would give it (0666 less the umask; an existing file keeps its own).

`check_outputs` checks every output path of a command before any rank starts: a folder where a file is
wanted, a parent that is a file, a folder that cannot be written in, two flags naming one file.

Every file a command writes for the user is said once, on stderr, in the form `--trace` uses: `json: PATH`,
`csv: PATH`, `plot: PATH` (`said`): write_result and write_csv say theirs when they write the final file, not
the snapshots of a job still going.

Exercised by: `pytest tests/test_bench_cli.py tests/test_failures.py tests/unit/test_atomic_write.py`.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from commprof.base.errors import CommprofError, UsageError


class OutputError(CommprofError):
    """A result file could not be written (a full disk, a device that refuses): exit 1."""

CSV_COLUMNS = ("collective", "algo", "backend", "world_size", "group_size", "groups", "dtype", "redop", "root",
               "inplace", "nbytes", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "time_us_min_rank",
               "time_us_max_rank",
               "slowest_rank", "p50_us", "p99_us", "min_us", "max_us", "model_us",
               "agg", "iters", "warmup", "agg_iters", "blocking", "check_iters")
"""bench's CSV: a row per JSON record. nccl-tests' columns (size, count, type, redop, root, time, algbw, busbw,
#wrong, with the mode a column of its own), commprof's statistics, then what -a, -n, -w, -m, -z and -c asked."""

SCRATCH_ENV = "COMMPROF_SCRATCH_JSON"
"""A --json path a command gave its own child (one job with --plot and no --json): not the user's, not said."""


def said(kind: str, path: str | Path) -> None:
    """One line on stderr naming a file written for the user: `json: out.json`."""
    if kind == "json" and os.environ.get(SCRATCH_ENV) == str(path):
        return
    sys.stderr.write(f"{kind}: {path}\n")
    sys.stderr.flush()


def write_atomic(path: str | Path, text: str, *, sync: bool = True, snapshot: bool = False) -> None:
    """Replace `path` by `text` in one rename. `sync` False skips the fsync: still whole after a killed
    process, only not after a crash of the machine. `snapshot`: the results of a run still going, rewritten
    as it goes — skipped for a device or a pipe, which take the final document only (a FIFO's reader sees
    one document). Raises OutputError (one line naming the file) when it cannot be written."""
    real = Path(os.path.realpath(path))
    if snapshot and real.exists() and not real.is_file():
        return
    try:
        _write(real, text, sync)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write(path: Path, text: str, sync: bool) -> None:  # a symlink's target is what gets replaced, not the link
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w") as f:  # a device or a pipe: written through, never replaced
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        os.fchmod(fd, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_stale(path: Path) -> None:
    """Temp files of `path` whose writer is gone (killed between its write and its rename: a 0-byte
    `.out.json.<pid>.<random>.tmp` beside the file), removed before the next write."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = stale.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except OSError:  # alive, another user's
            pass


def _umask() -> int:
    try:  # read, where Linux tells it, rather than set and reset: another thread may be creating a file
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_outputs(files: dict[str, str | None], folders: dict[str, str | None] | None = None) -> None:
    """Raise UsageError, one line naming the flag, unless every given path can be written: `files` and
    `folders` map a flag (--json, --trace, …) to its path or None. Nothing is created."""
    folders = folders or {}
    seen: dict[str, tuple[str, str]] = {}
    for flag, value in [*files.items(), *folders.items()]:
        if value is None:
            continue
        if value == "":
            raise UsageError(f"{flag}: the path is empty")
        folder = flag in folders
        real = os.path.realpath(value)
        if real in seen and not folder and seen[real][0] not in folders:
            first = " ".join(seen[real]) if seen[real][1] != value else seen[real][0]
            raise UsageError(f"{first} and {flag} {value} name one file: give each its own")
        seen.setdefault(real, (flag, value))
        if os.path.exists(real):
            is_dir = os.path.isdir(real)
            if folder and not is_dir:
                raise UsageError(f"{flag} {value}: is a file, not a folder")
            if not folder and is_dir:
                raise UsageError(f"{flag} {value}: is a folder, not a file")
            if folder or stat.S_ISREG(os.stat(real).st_mode):  # a device or a pipe is written through
                _writable(flag, value, real if folder else os.path.dirname(real))
            continue
        ancestor = os.path.dirname(real)
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise UsageError(f"{flag} {value}: {ancestor} is a file, not a folder")
        _writable(flag, value, ancestor)


def _writable(flag: str, value: str, folder: str) -> None:
    """A file can be made in `folder` (tried, and gone again)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {value}: cannot write in {folder} ({exc.strerror or exc})") from None


def write_result(path: str | Path, doc: dict, *, snapshot: bool = False, say: bool = True) -> None:
    """Every command's JSON document, written one way: indented, atomically, and said (`json: PATH`) unless
    `snapshot` — the results of a job still going (not synced to disk, skipped for a device or a pipe) — or
    `say` is False, or the document is marked incomplete: a failed job says one line, its error."""
    text = json.dumps(doc, indent=1) + "\n"
    if snapshot and doc.get("reason") == RUNNING:  # room kept to say, in place, why it stopped (below)
        text = text.replace(_RUNNING, _RUNNING + " " * REASON_ROOM, 1)
    try:
        write_atomic(path, text, sync=not snapshot, snapshot=snapshot)
    except OutputError:
        if not snapshot and doc.get("complete") is False and doc.get("reason"):
            _reason_in_place(Path(path), doc["reason"])
        raise
    if say and not snapshot and doc.get("complete") is not False:
        said("json", path)


RUNNING = "running"
"""The reason of a document written while its job still runs."""
_RUNNING = f'"reason": "{RUNNING}",'
REASON_ROOM = 240
"""Spaces kept after a running document's reason: where the disk is full when the job ends, the reason it
stopped is written over them, in place, on blocks the file already has."""


def _reason_in_place(path: Path, reason: str) -> None:
    """A running document that cannot be replaced (a full disk): its reason overwritten in place, shortened to
    the room kept, so that it does not go on saying "running"."""
    try:
        with open(path, "r+b") as f:
            head = f.read(4096)
            at = head.find(_RUNNING.encode())
            if at < 0:
                return
            room = len(_RUNNING) + len(head[at + len(_RUNNING):]) - len(head[at + len(_RUNNING):].lstrip(b" "))
            for keep in range(len(reason), -1, -1):
                shown = reason[:keep] + ("…" if keep < len(reason) else "")
                new = f'"reason": {json.dumps(shown)},'.encode()
                if len(new) <= room:
                    break
            f.seek(at)
            f.write(new.ljust(room))
    except OSError:
        pass


def write_json(path: str | Path, env: dict, results: list[dict], *, complete: bool = True,
               reason: str | None = None, snapshot: bool = False) -> None:
    """The bench's results so far; `complete` False (with the reason) while or because the sweep stopped
    early; `snapshot`: while it goes."""
    doc = {"complete": complete, **({"reason": reason} if reason else {}), "env": env, "results": results}
    write_result(path, doc, snapshot=snapshot)


def mark_incomplete(path: str | Path, reason: str) -> None:
    """After a failed job: a JSON that is not marked complete says why it stopped (made if absent)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a pipe took the results as they came
        return
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        doc = {}
    if not isinstance(doc, dict) or doc.get("complete") is True:
        return
    doc = {"complete": False, "reason": reason, **{k: v for k, v in doc.items() if k not in ("complete", "reason")}}
    write_result(path, doc, say=False)  # the rank that wrote it said so


def write_csv(path: str | Path, results: list[dict], *, snapshot: bool = False,
              columns: tuple[str, ...] = CSV_COLUMNS, say: bool = True) -> None:
    """A row per dict, `columns` only (bench's by default), said (`csv: PATH`) unless `snapshot` or `say` is
    False."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(results)
    write_atomic(path, buf.getvalue(), sync=not snapshot, snapshot=snapshot)
    if say and not snapshot:
        said("csv", path)


@dataclass(frozen=True)
class Outputs:
    """Where a job writes, and the command line it was started with: part of every command's config."""

    argv: tuple[str, ...] = ()
    """The arguments after `commprof`: the launcher starts every rank with them, the env block records them."""
    json: str | None = None
    """--json: env and results as JSON, rewritten as they arrive and marked complete at the end."""
    csv: str | None = None
    """--csv: results as CSV (bench: a row per result; run: a row of the run's figures)."""
    trace: str | None = None
    """--trace: the folder of the per-rank Chrome traces and the merged trace.json."""
    debug_dump: str | None = None
    """--debug-dump: the folder of each rank's flight record after a failure."""

    @classmethod
    def from_args(cls, args) -> "Outputs":
        """The output flags a command's parser gave (flags.add_job_flags; --csv where it has one)."""
        return cls(argv=tuple(args.argv), json=args.json, csv=getattr(args, "csv", None), trace=args.trace,
                   debug_dump=args.debug_dump)

    def check(self, more: dict[str, str | None] | None = None) -> None:
        """Every path here and in `more` (a flag -> the file it names: --live-log) can be written, and no two
        flags name one file; raises UsageError."""
        check_outputs({"--json": self.json, "--csv": self.csv, **(more or {})},
                      {"--trace": self.trace, "--debug-dump": self.debug_dump})

    def dump_folder(self) -> str | None:
        """Where a failing rank writes its flight record: --debug-dump, else the --json file's folder."""
        if self.debug_dump:
            return self.debug_dump
        return str(Path(self.json).resolve().parent) if self.json else None
