"""`commprof report live.jsonl`: a live job's log (`--live-log`) read back — what held when, as tables, and
with --plot the step time and each finding's ms/step against the step.

    commprof report live.jsonl
    commprof report live.jsonl --plot plots/        # plots/live.png

The log's rotated part (FILE.1, live/export.py) is read first when it is there. A line cut short (a disk that
filled mid-write) is left out and said. Exercised by: `pytest tests/unit/test_live.py tests/test_live_jobs.py`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.report.live_line import from_line

MAX_ROWS = 30
"""Windows a table shows: a longer log shows this many, evenly spaced, the first and the last among them."""


def subject(f: dict) -> str:
    """What a finding names: 'rank 1', an op, or '' (latency_bound: the job's small collectives)."""
    if "rank" in f:
        return f"rank {f['rank']}"
    return f.get("op") or ""


def finding_key(f: dict) -> str:
    """What makes two windows' findings the same one: its kind and what it names."""
    return f"{f['kind']}:{subject(f)}"


def read(path: str, not_ours: str) -> dict:
    """{"windows": [combined windows in order], "end": the end line's reason or None, "cut": lines left out},
    read line by line: each window but the last keeps, of its per-rank figures, only what the tables show
    (`summary`), so a log of any length and world size is held as a few hundred bytes a window."""
    windows, end, cut = [], None, 0
    for part in (path + ".1", path):
        if part != path and not os.path.isfile(part):
            continue
        try:
            with open(part, encoding="utf-8") as f:
                for n, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    try:
                        doc = json.loads(raw)
                    except ValueError:
                        cut += 1
                        continue
                    except RecursionError:  # nested past what the parser takes: no window of ours
                        doc = None
                    if not isinstance(doc, dict) or not ("end" in doc or {"window", "ranks", "findings"} <= set(doc)):
                        raise UsageError(f"{part}: {not_ours} (line {n} is not a live window)")
                    if "end" in doc:
                        end = doc["end"]
                        continue
                    doc = from_line(doc)
                    if windows:
                        windows[-1]["ranks"] = summary(windows[-1])
                        windows[-1].pop("hosts", None)
                    windows.append(doc)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{part}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    if not windows:
        raise UsageError(f"{path}: {not_ours} (no live window in it)")
    return {"windows": windows, "end": end, "cut": cut}


def summary(window: dict) -> dict:
    """A window's per-rank figures as the windows table shows them: how many ranks, the least and most busy,
    the longest wait, the ops — from its ranks, or from its hosts' figures (a job of several hosts)."""
    ranks = window["ranks"]
    if isinstance(ranks, dict):
        return ranks
    if not ranks and window.get("hosts"):
        hosts = window["hosts"]
        return {"count": window["world_size"], "busy_min": min(h["busy_ms_range"][0] for h in hosts),
                "busy_max": max(h["busy_ms_range"][1] for h in hosts),
                "waiting_max": max(h["waiting_ms_max"] for h in hosts), "ops": sum(h["ops"] for h in hosts)}
    return {"count": len(ranks), "busy_min": min(r["busy_ms"] for r in ranks),
            "busy_max": max(r["busy_ms"] for r in ranks), "waiting_max": max(r["waiting_ms"] for r in ranks),
            "ops": sum(agg[0] for r in ranks for agg in r["ops"].values())}


def looks_live(path: str) -> bool:
    """Whether `path` is a regular file that begins as a live log does: a JSON object of a window, or an end
    line, on its first line. Anything else is left to the JSON reader, which names what is wrong with it (a
    FIFO is not opened here: its open would wait for a writer)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return False
            head = f.readline(1 << 16)
    except OSError:
        return False
    # a window's line is about 470 B a rank, past any fixed read at a few hundred ranks: its first key says
    # what it is (live/export.py writes "window" or "end" first), and `read` checks every line whole
    return head.startswith((b'{"window":', b'{"end":'))


def runs(windows: list[dict]) -> list[dict]:
    """Each finding's runs: consecutive windows that hold it, with the step it began, the step it ended and
    its median ms/step over them."""
    open_runs: dict[str, dict] = {}
    done = []
    for w in windows:
        now = {finding_key(f): f for f in w["findings"]}
        for key in [k for k in open_runs if k not in now]:
            done.append(open_runs.pop(key))
        for key, f in now.items():
            run = open_runs.setdefault(key, {"kind": f["kind"], "subject": subject(f), "from": w["first_step"],
                                             "ms": [], "shares": [], "contended": 0})
            run["to"] = w["last_step"]
            run["contended"] += bool(f.get("contended") or contended(w))
            run["ms"].append(f["ms_per_step"])
            run["shares"].append(f["share_of_step"])
    done += open_runs.values()
    return sorted(done, key=lambda r: r["from"])


def contended(window: dict) -> float | None:
    """The cores other processes used on rank 0's host over `window` when that made it contended
    (record/contention.py), else None."""
    reading = window.get("contention") or {}
    return reading.get("others_cores", 0.0) if reading.get("contended") else None


def render(doc: dict, console, *, plot_dir: str | None = None) -> list[Path]:
    """The log's tables on `console`; with `plot_dir`, its plot (the paths drawn)."""
    import statistics

    from rich.table import Table

    windows = doc["windows"]
    last = summary(windows[-1])
    ranks = last["count"]
    console.print(f"live log: {len(windows)} window(s), steps {windows[0]['first_step']}-{windows[-1]['last_step']}, "
                  f"{ranks} rank(s); " + (f"ended: {doc['end']}" if doc["end"] else "no end line (still running, "
                                                                                   "or its rank 0 died)")
                  + (f"; {doc['cut']} line(s) cut short left out" if doc["cut"] else ""), highlight=False)
    held = Table(title="findings as they held (consecutive windows)")
    for name in ("finding", "subject", "from step", "to step", "windows", "ms/step (median)", "of the step",
                 "contended"):
        held.add_column(name, justify="left" if name in ("finding", "subject") else "right")
    for r in runs(windows):
        held.add_row(r["kind"], r["subject"], str(r["from"]), str(r["to"]), str(len(r["ms"])),
                     f"{statistics.median(r['ms']):.2f}", f"{statistics.median(r['shares']):.0%}",
                     f"{r['contended']} of {len(r['ms'])}" if r["contended"] else "")
    console.print(held)
    shown = windows if len(windows) <= MAX_ROWS else [windows[round(i * (len(windows) - 1) / (MAX_ROWS - 1))]
                                                      for i in range(MAX_ROWS)]
    table = Table(title="windows" + ("" if shown is windows else f" ({MAX_ROWS} of {len(windows)}, evenly spaced)"))
    for name in ("steps", "step ms", "busy ms (min–max rank)", "waiting ms (max)", "top finding", "contended"):
        table.add_column(name, justify="left" if name in ("steps", "top finding") else "right")
    for w in shown:
        figures = summary(w)
        top = w["findings"][0] if w["findings"] else None
        others = contended(w)
        table.add_row(f"{w['first_step']}-{w['last_step']}", f"{w['step_ms']:.2f}",
                      f"{figures['busy_min']:.2f}–{figures['busy_max']:.2f}", f"{figures['waiting_max']:.2f}",
                      "" if top is None else f"{top['kind']} {subject(top)} {top['ms_per_step']:.2f} ms "
                                             f"({top['share_of_step']:.0%})",
                      "" if others is None else f"{others:.1f} cores")
    console.print(table)
    if any(contended(w) is not None for w in windows):
        console.print("contended: other processes used that many cores of rank 0's host over the window: its "
                      "timings, and a finding held then, include that competition", highlight=False)
    hosts = f" on {len(windows[-1]['hosts'])} host(s)" if windows[-1].get("hosts") else ""
    console.print(f"last window: {last['ops']:,} op(s) over {ranks} rank(s){hosts}", highlight=False)
    return [plot(windows, Path(plot_dir) / "live.png")] if plot_dir else []


def plot(windows: list[dict], path: Path) -> Path:
    """The step time, and each finding's ms/step (0 where a window does not hold it), against the step."""
    from commprof.report.canvas import draw_lines, figure

    path.parent.mkdir(parents=True, exist_ok=True)
    x = [(w["first_step"] + w["last_step"]) / 2 for w in windows]
    lines = {"step": (x, [w["step_ms"] for w in windows])}
    for r in runs(windows):
        label = f"{r['kind']} {r['subject']}".strip()
        if label not in lines:
            by_window = [next((f["ms_per_step"] for f in w["findings"]
                               if f"{f['kind']} {subject(f)}".strip() == label), 0.0) for w in windows]
            lines[label] = (x, by_window)
    with figure(path, (9, 4.5)) as (_, axes):
        ax = axes[0][0]
        draw_lines(ax, lines)
        ax.set_xlabel("step")
        ax.set_ylabel("ms per step")
        ax.set_title("live: step time and what each finding costs a step, window by window")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8)
    return path
