"""Build and read the NVTX recorder (tests/support/nvtx_recorder.c) -- NVTX checks without Nsight.

The recorder is an NVTX injection library: NVTX loads the library named by
``NVTX_INJECTION64_PATH`` (exactly as Nsight Systems does) and the recorder
appends one tab-separated line per NVTX event to ``$COMMPROF_NVTX_RECORD.<pid>``.

Library use (e.g. from tests, after ``sys.path.insert(0, "<repo>/tools")``)::

    import nvtx_recorder
    lib = nvtx_recorder.build(tmp_path)                    # gcc, ~0.3 s
    env = nvtx_recorder.recorder_env(lib, tmp_path / "rec")
    subprocess.run([sys.executable, "script.py"], env=env, check=True)
    records = nvtx_recorder.read_records(tmp_path / "rec")
    ranges = nvtx_recorder.start_end_ranges(records)      # start/end ranges, paired, with durations

Command line (prints ranges per domain/category/message; --chrome also writes the recording as a
Chrome Trace Event file, the format of `commprof … --trace`, one process per recorded pid)::

    python tests/support/nvtx_recorder.py [--out PREFIX] [--chrome TRACE.json] -- CMD [ARGS...]
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("nvtx_recorder.c")
LIB_NAME = "libnvtx_recorder.so"
_HEADER = Path("nvtx3") / "nvToolsExt.h"
_NVTX_DISTS = ("nvidia-nvtx", "nvidia-nvtx-cu12", "nvidia-nvtx-cu11", "nvtx")


class RecorderBuildError(RuntimeError):
    """gcc or the NVTX3 headers are missing, or compilation failed."""


def _candidate_include_dirs():
    if os.environ.get("NVTX_INCLUDE_DIR"):
        yield Path(os.environ["NVTX_INCLUDE_DIR"])
    # Installed wheels: nvidia-nvtx ships nvidia/<cuXX|nvtx>/include/nvtx3/*.h.
    for dist_name in _NVTX_DISTS:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name == _HEADER.name and f.parent.name == "nvtx3":
                yield Path(dist.locate_file(f)).parent.parent
    # Namespace package / nvtx package directories, whatever installed them.
    for mod_name in ("nvidia", "nvtx"):
        try:
            mod = __import__(mod_name)
        except ImportError:
            continue
        for root in getattr(mod, "__path__", ()):
            for hdr in sorted(Path(root).glob("**/nvtx3/nvToolsExt.h")):
                yield hdr.parent.parent
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            yield Path(os.environ[env]) / "include"
    yield Path("/usr/local/cuda/include")
    yield Path("/usr/include")


def find_include_dir() -> Path:
    """Directory that contains ``nvtx3/nvToolsExt.h`` (pass it to ``gcc -I``)."""
    for cand in _candidate_include_dirs():
        if (cand / _HEADER).is_file():
            return cand
    raise RecorderBuildError(
        "NVTX3 headers (nvtx3/nvToolsExt.h) not found: install the 'nvidia-nvtx' "
        "wheel (pip install nvidia-nvtx) or set NVTX_INCLUDE_DIR to the directory "
        "containing nvtx3/")


def build(out_dir: Path) -> Path:
    """Compile the recorder into ``out_dir/libnvtx_recorder.so`` and return its path."""
    cc = os.environ.get("CC") or shutil.which("gcc")
    if not cc or not shutil.which(cc):
        raise RecorderBuildError("gcc not found on PATH (needed to build the NVTX recorder)")
    include = find_include_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIB_NAME
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", f"-I{include}",
           "-o", str(lib), str(SOURCE), "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RecorderBuildError(
            f"building the NVTX recorder failed ({' '.join(cmd)}):\n{proc.stderr}")
    return lib.resolve()


def recorder_env(lib: Path, prefix: Path, base: dict | None = None) -> dict:
    """Copy of ``base`` (default ``os.environ``) with the recorder injected."""
    env = dict(os.environ if base is None else base)
    env["NVTX_INJECTION64_PATH"] = str(Path(lib).resolve())
    env["COMMPROF_NVTX_RECORD"] = str(Path(prefix).resolve())
    return env


def record_files(prefix: Path) -> list[Path]:
    """All ``<prefix>.<pid>`` files, sorted by pid."""
    prefix = Path(prefix)
    files = [p for p in prefix.parent.glob(prefix.name + ".*")
             if p.name[len(prefix.name) + 1:].isdigit()]
    return sorted(files, key=lambda p: int(p.name[len(prefix.name) + 1:]))


def read_records(prefix: Path) -> list[dict]:
    """Parse every ``<prefix>.<pid>`` file, in pid order then event order.

    Each record: ``pid, kind ('push'|'pop'|'mark'|'start'|'end'), domain
    ('' = default domain), category (name, '' if none, str(id) if unnamed),
    message, depth (int; push/pop/mark, else None), range_id (int; start/end,
    else None), tid, ts_ns (CLOCK_MONOTONIC), color (ARGB int or None), payload
    (int/float or None)``.
    """
    records = []
    for path in record_files(prefix):
        pid = int(path.name.rsplit(".", 1)[1])
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) != 9:
                raise ValueError(f"{path}: malformed NVTX record line {line!r}")
            kind, domain, category, message, n, tid, ts, color, payload = fields
            ranged = kind in ("start", "end")
            records.append(dict(
                pid=pid, kind=kind, domain=domain, category=category, message=message,
                depth=None if ranged else int(n), range_id=int(n) if ranged else None,
                tid=int(tid), ts_ns=int(ts), color=int(color, 16) if color else None,
                payload=_number(payload)))
    return records


def _number(text: str):
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def unbalanced(records: list[dict]) -> dict:
    """``{(pid, tid, domain): open_ranges}`` for push/pop streams that do not balance
    (negative counts mean pops without a matching push)."""
    open_ = collections.Counter()
    bad = set()
    for r in records:
        key = (r["pid"], r["tid"], r["domain"])
        if r["kind"] == "push":
            open_[key] += 1
        elif r["kind"] == "pop":
            open_[key] -= 1
            if r["depth"] < 0:
                bad.add(key)
    return {k: v for k, v in open_.items() if v or k in bad}


def start_end_ranges(records: list[dict]) -> list[dict]:
    """Every start/end range, its start record paired with its end by (pid, range id), in start order: the
    start record plus ``end_tid`` and ``dur_ns`` (both None for a range never ended). The end may come from
    another thread than the start, as NVTX allows."""
    ranges, started = [], {}
    for r in records:
        if r["kind"] == "start":
            started[(r["pid"], r["range_id"])] = r = dict(r, end_tid=None, dur_ns=None)
            ranges.append(r)
        elif r["kind"] == "end":
            opened = started.pop((r["pid"], r["range_id"]), None)
            if opened is not None:
                opened.update(end_tid=r["tid"], dur_ns=r["ts_ns"] - opened["ts_ns"])
    return ranges


def summarize(records: list[dict]) -> collections.Counter:
    """Count of ranges (push and start) per ``(domain, category, message)``."""
    return collections.Counter((r["domain"], r["category"], r["message"])
                               for r in records if r["kind"] in ("push", "start"))


def to_chrome(records: list[dict]) -> list[dict]:
    """Recorded push/pop (and start/end) pairs as Chrome "X" events: name = message, cat = category,
    ts/dur in µs from the first event, args.bytes = the payload; one process per pid, threads by tid."""
    if not records:
        return []
    t0 = min(r["ts_ns"] for r in records)
    events, stacks, started = [], collections.defaultdict(list), {}
    for pid in sorted({r["pid"] for r in records}):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"pid {pid}"}})
    for r in records:
        key = (r["pid"], r["tid"], r["domain"])
        if r["kind"] == "push":
            stacks[key].append(r)
        elif r["kind"] == "start":
            started[(r["pid"], r["range_id"])] = r
        elif r["kind"] in ("pop", "end"):
            opened = (stacks[key].pop() if stacks[key] else None) if r["kind"] == "pop" \
                else started.pop((r["pid"], r["range_id"]), None)
            if opened is None:
                continue
            ev = {"name": opened["message"], "cat": opened["category"], "ph": "X", "pid": r["pid"],
                  "tid": opened["tid"], "ts": (opened["ts_ns"] - t0) / 1e3, "dur": (r["ts_ns"] - opened["ts_ns"]) / 1e3}
            if opened["payload"] is not None:
                ev["args"] = {"bytes": opened["payload"]}
            events.append(ev)
    return events


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Run a command with the NVTX recorder injected and summarize its ranges.",
        usage="%(prog)s [--out PREFIX] -- CMD [ARGS...]")
    parser.add_argument("--out", type=Path,
                        help="keep the records as PREFIX.<pid> (default: temporary)")
    parser.add_argument("--chrome", type=Path, help="also write the ranges as a Chrome trace to this file")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (use: -- CMD [ARGS...])")
    with tempfile.TemporaryDirectory(prefix="nvtx_recorder_") as tmp:
        lib = build(Path(tmp))
        prefix = args.out if args.out else Path(tmp) / "nvtx"
        for stale in record_files(prefix):
            stale.unlink()
        rc = subprocess.call(cmd, env=recorder_env(lib, prefix))
        records = read_records(prefix)
    if args.chrome:
        args.chrome.write_text(json.dumps({"traceEvents": to_chrome(records)}) + "\n")
    counts = summarize(records)
    pids = sorted({r["pid"] for r in records})
    print(f"\n[nvtx_recorder] {sum(counts.values())} ranges, "
          f"{sum(r['kind'] == 'mark' for r in records)} marks from {len(pids)} process(es)")
    print(f"{'count':>7}  {'domain':<16} {'category':<16} message")
    for (domain, category, message), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"{n:>7}  {domain or '<default>':<16} {category:<16} {message}")
    for (pid, tid, domain), n in unbalanced(records).items():
        print(f"[nvtx_recorder] WARNING: unbalanced push/pop in pid {pid} tid {tid} "
              f"domain {domain or '<default>'!r}: {n:+d} open")
    for r in start_end_ranges(records):
        if r["dur_ns"] is None:
            print(f"[nvtx_recorder] WARNING: start/end range {r['message']!r} in pid {r['pid']} never ended")
    if args.out:
        print(f"[nvtx_recorder] records kept at {args.out}.<pid>")
    return rc


if __name__ == "__main__":
    sys.exit(main())
