"""Comparisons: a grid's runs as one table (a row per configuration), bench results as scaling tables
(size rows × rank-count columns), several bench files side by side with ratios; rows are plain data,
tables render them. Written by a grid (commprof/cli/sweep.py) and by `commprof report`.

Exercised by: `pytest tests/test_sweep.py tests/unit/test_report_recorded.py`.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from commprof.base.files import write_atomic, write_result
from commprof.base.units import format_bytes
from commprof.report.bench_table import collective_label, ranks_key, ranks_label, several_roots
from commprof.report.fit import Narrowing, results_console

RUN_COLUMNS = ("label", "wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_pct", "bubble_ms", "other_ms",
               "throughput", "throughput_unit", "epoch_s", "payload_bytes_per_step",
               "predicted_payload_bytes_per_step", "payload_bytes_per_epoch", "peak_mem_bytes", "final_loss",
               "steps_to_threshold", "speedup", "efficiency", "baseline", "error")


def run_row(run: dict) -> dict:
    """One configuration's figures (its error instead when it failed)."""
    row = {"label": run["label"], **{k: None for k in RUN_COLUMNS[1:]}, "error": run.get("error")}
    doc = run.get("result")
    if doc is None:
        return row
    s, volume = doc["summary"], doc["volume"].values()
    row["caveat"] = caveat(doc.get("env") or {})
    # a profile's summary has no throughput without --global-batch, and no epoch or metrics: left empty
    row.update({k: s.get(k) for k in ("wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_pct",
                                      "bubble_ms", "other_ms", "throughput", "throughput_unit", "epoch_s",
                                      "peak_mem_bytes")})
    row["payload_bytes_per_step"] = sum(v["payload_bytes_per_step"] for v in volume)
    predicted = [v.get("predicted_payload_bytes_per_step") for v in volume]
    row["predicted_payload_bytes_per_step"] = None if None in predicted else sum(predicted)
    row["payload_bytes_per_epoch"] = sum(v["bytes_per_epoch"] for v in volume)
    metrics = doc.get("metrics") or {}
    row["final_loss"] = metrics.get("final_loss")
    row["steps_to_threshold"] = metrics.get("steps_to_threshold")
    return row


def run_rows(runs: list[dict]) -> list[dict]:
    """Rows of every run; speed-up (throughput over the baseline's) and efficiency (speed-up / ranks).
    The baseline is the `single` run agreeing on every flag but strategy and ranks, or, where the grid has
    none, the same configuration at 1 rank (the scaling of one strategy); `baseline` names it."""
    rows = [run_row(r) for r in runs]
    ok = [(r, row) for r, row in zip(runs, rows) if row["throughput"]]
    for run, row in zip(runs, rows):
        if row["throughput"] is None:
            continue
        base = next((b for r, b in ok if _strategy(r) == "single" and _others(r) == _others(run)), None) \
            or next((b for r, b in ok if _ranks(r) == 1 and _but_ranks(r) == _but_ranks(run)), None)
        if base is not None:
            row["speedup"] = row["throughput"] / base["throughput"]
            row["efficiency"] = row["speedup"] / _ranks(run)
            row["baseline"] = base["label"]
            row["baseline_caveat"] = base.get("caveat")
    return rows


def _strategy(run: dict) -> str | None:
    doc = run.get("result")
    return doc["config"]["strategy"] if doc else run["config"].get("--strategy")


def _ranks(run: dict) -> int:
    return run["result"]["env"].get("world_size") or 1


def _others(run: dict) -> dict:
    return {k: v for k, v in run["config"].items() if k not in ("--strategy", "--nproc")}


def _but_ranks(run: dict) -> dict:
    return {k: v for k, v in run["config"].items() if k != "--nproc"}


def _n(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


RUN_HEADS = ("configuration", "wall ms", "compute ms", "comm ms", "exposed ms", "overlap %", "bubble ms",
             "throughput", "epoch s", "payload/step", "predicted", "payload/epoch", "peak mem", "final loss",
             "steps to thr.", "speed-up", "efficiency")
"""The comparison table's columns, in the terminal and in Markdown."""


def caveat(env: dict) -> str | None:
    """What makes a configuration's times measure more than the job: its ranks oversubscribed the cores, or
    other processes used them meanwhile (record/contention.py); None when neither."""
    said = []
    if env.get("oversubscribed"):
        said.append(f"oversubscribed {env.get('ranks_per_host')} ranks on {env.get('slots_per_host')} cores")
    if (env.get("contention") or {}).get("contended"):
        said.append(f"contended {env['contention']['others_cores']:.1f} cores")
    return "; ".join(said) or None


def run_cells(r: dict) -> list[str]:
    """One row's cells under RUN_HEADS (a failed run: its error in the second). A configuration whose times
    measured more than the job says so beside its name, and a speed-up over or against it is marked `?`: a
    figure built on such times misleads (an oversubscribed baseline made a 24.7× "speed-up")."""
    if r["error"]:
        return [r["label"], f"failed: {r['error']}", *[""] * (len(RUN_HEADS) - 2)]
    doubt = "?" if r.get("caveat") or r.get("baseline_caveat") else ""
    label = f"{r['label']} ({r['caveat']})" if r.get("caveat") else r["label"]
    return [label, _n(r["wall_ms"]), _n(r["compute_ms"]), _n(r["comm_ms"]), _n(r["exposed_comm_ms"]),
            _n(r["overlap_pct"], 1), _n(r["bubble_ms"]),
            " ".join(filter(None, (_n(r["throughput"], 1), r["throughput_unit"]))),
            _n(r["epoch_s"], 1), format_bytes(r["payload_bytes_per_step"]),
            _predicted(r["payload_bytes_per_step"], r["predicted_payload_bytes_per_step"]),
            format_bytes(r["payload_bytes_per_epoch"]), format_bytes(r["peak_mem_bytes"]), _n(r["final_loss"], 4),
            "—" if r["steps_to_threshold"] is None else str(r["steps_to_threshold"]),
            _n(r["speedup"]) + (doubt if r["speedup"] is not None else ""),
            _n(r["efficiency"]) + (doubt if r["efficiency"] is not None else "")]


def _predicted(measured: int, predicted: int | None) -> str:
    """"=" where the prediction is exact; else the prediction and how far off, in bytes."""
    if predicted is None:
        return "—"
    return "=" if predicted == measured else f"{format_bytes(predicted)} ({predicted - measured:+,} B)"


RUN_NARROW_DROP = ("steps to thr.", "payload/epoch", "predicted", "epoch s", "peak mem", "efficiency", "bubble ms",
                   "final loss", "overlap %", "payload/step", "throughput")
"""The comparison table's columns a narrow terminal goes without, first to last."""


def run_table(rows: list[dict], title: str = "grid") -> Narrowing:
    table = Table(title=f"{title}: medians per iteration, averaged over ranks")
    for h in RUN_HEADS:
        table.add_column(h, justify="left" if h == "configuration" else "right")
    for r in rows:
        cells = run_cells(r)
        if r["error"]:
            cells[1] = f"[red]{cells[1]}[/red]"
        table.add_row(*cells)
    if any(r.get("caveat") or r.get("baseline_caveat") for r in rows if not r["error"]):
        table.caption = ("?: a speed-up or efficiency over or of a configuration whose times measured more than "
                         "the job (oversubscribed or contended, named beside it)")
        table.caption_justify = "left"
    return Narrowing(table, RUN_NARROW_DROP)


def run_markdown(rows: list[dict]) -> str:
    """The comparison table as GitHub Markdown, with a line saying what the speed-up is over."""
    lines = ["| " + " | ".join(RUN_HEADS) + " |",
             "| --- | " + " | ".join("---:" for _ in RUN_HEADS[1:]) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in run_cells(r)) + " |" for r in rows]
    if any(r.get("baseline") for r in rows):
        lines += ["", "Speed-up: throughput over the `single` run with the same other flags, or where the grid "
                      "has none, over the same configuration at 1 rank; efficiency: speed-up / ranks."]
    if any(r.get("caveat") or r.get("baseline_caveat") for r in rows if not r["error"]):
        lines += ["", "?: over or of a configuration whose times measured more than the job (oversubscribed or "
                      "contended, named beside it)."]
    return "\n".join(lines) + "\n"


def scaling(records: list[dict]) -> dict[tuple, dict[int, dict[tuple, dict]]]:
    """(collective, algo, backend, dtype, redop, inplace, root) -> size -> (group size, groups) -> record. The
    root is None but for collectives measured at several roots (-r all), whose roots get a table each."""
    roots = several_roots(records)
    out: dict = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        root = rec.get("root") if rec["collective"] in roots else None
        key = (rec["collective"], rec["algo"], rec["backend"], rec["dtype"], rec["redop"], rec["inplace"], root)
        out[key][rec["nbytes"]][ranks_key(rec)] = rec
    return out


def scaling_tables(records: list[dict]) -> list[Narrowing]:
    """Per collective and mode: size rows × rank-count columns of time and busbw (a narrow terminal: time
    alone)."""
    tables = []
    for key, by_size in scaling(records).items():
        coll, algo, backend, dtype, redop, inplace, root = key
        sizes = sorted({n for n in by_size for n in by_size[n]})
        mode = f"{'in' if inplace else 'out-of'}-place"
        table = Table(title=f"{collective_label(coll, root=root)} ({algo}, {backend}, {dtype}"
                            f"{', ' + redop if redop else ''}, {mode}) across rank counts")
        table.add_column("size (B)", justify="right")
        for n in sizes:
            table.add_column(f"{ranks_label(n)} time (us)", justify="right")
            table.add_column("busbw (GB/s)", justify="right")
        for nbytes in sorted(by_size):
            cells = []
            for n in sizes:
                rec = by_size[nbytes].get(n)
                cells += ["—", "—"] if rec is None else [_n(rec["time_us"]), _n(rec["busbw_GBps"], 3)]
            table.add_row(str(nbytes), *cells)
        tables.append(Narrowing(table, ("busbw (GB/s)",)))
    return tables


def side_by_side(names: list[str], docs: list[dict]) -> tuple[list[dict], Table]:
    """Bench files side by side: each (collective, algo, size, mode, dtype, op, ranks per group) row's time
    in every file, and each file's time over the first file's."""
    # keyed by the ranks of one group: a group measured alone lines up with the same group size measured
    # beside others (--concurrent), and the ratio is what the contention cost
    keyed = [{(r["collective"], r["algo"], r["nbytes"], r["inplace"], r["dtype"], r["redop"], ranks_key(r)[0]): r
              for r in doc["results"]} for doc in docs]
    rows = []
    for key in sorted(set().union(*keyed), key=lambda k: tuple(str(x) for x in k[:2]) + (k[2], k[3], str(k[4:]))):
        times = [k[key]["time_us"] if key in k else None for k in keyed]
        first = times[0]
        rows.append({"collective": key[0], "algo": key[1], "nbytes": key[2], "inplace": key[3], "dtype": key[4],
                     "redop": key[5], "ranks": key[6], "time_us": times,
                     "ratio": [None if t is None or not first else t / first for t in times]})
    table = Table(title="bench results side by side: time (us), and over the first file's")
    for h in ("collective", "algo", "size (B)", "mode", "ranks"):
        table.add_column(h, justify="right" if h in ("size (B)", "ranks") else "left")
    for i, name in enumerate(names):
        table.add_column(name, justify="right")
        if i:
            table.add_column(f"{name} ÷ first", justify="right")
    for r in rows:
        cells = []
        for i, (t, q) in enumerate(zip(r["time_us"], r["ratio"])):
            cells.append(_n(t))
            if i:
                cells.append(_n(q, 3))
        table.add_row(r["collective"], r["algo"], str(r["nbytes"]), "in" if r["inplace"] else "out",
                      str(r["ranks"]), *cells)
    return rows, table


def side_by_side_csv(names: list[str], rows: list[dict]) -> str:
    """side_by_side's rows as CSV: a row's keys, then each file's time and its ratio to the first's."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["collective", "algo", "nbytes", "inplace", "dtype", "redop", "ranks",
                     *(f"time_us[{n}]" for n in names), *(f"over_first[{n}]" for n in names[1:])])
    for r in rows:
        writer.writerow([r["collective"], r["algo"], r["nbytes"], r["inplace"], r["dtype"], r["redop"], r["ranks"],
                         *("" if t is None else t for t in r["time_us"]),
                         *("" if q is None else q for q in r["ratio"][1:])])
    return buf.getvalue()


def render(doc: dict, *, json_path: str | None = None, csv_path: str | None = None,
           plot_dir: str | None = None, link_GBps: float | None = None, console: Console | None = None) -> dict:
    """A grid document's tables on stdout, and its files; returns the plots' data ({} without --plot)."""
    out = console or results_console(width=220)
    if doc["command"] == "bench":
        for table in scaling_tables(doc["results"]):
            out.print(table)
        rows = doc["results"]
    else:
        rows = run_rows(doc["runs"])
        out.print(run_table(rows))
    if json_path:
        write_result(json_path, doc)
    if csv_path:
        write_atomic(csv_path, _csv(rows, RUN_COLUMNS if doc["command"] == "run" else None))
    if not plot_dir:
        return {}
    from commprof.report import plots

    if doc["command"] == "bench":
        return plots.bench_plots(doc["results"], plot_dir, link_GBps=link_GBps)
    ok = [{"label": r["label"], "config": {k.lstrip("-"): _number(v) for k, v in r["config"].items()},
           "result": r["result"]} for r in doc["runs"] if r["result"]]
    factor = next((f.lstrip("-") for f, vs in doc["grid"].items()
                   if len(vs) > 1 and all(isinstance(_number(v), (int, float)) for v in vs)), None)
    return plots.run_plots(ok, plot_dir, factor=factor) if ok else {}


def _number(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            pass
    return value


def _csv(rows: list[dict], columns) -> str:
    if columns is None:
        from commprof.base.files import CSV_COLUMNS
        columns = CSV_COLUMNS
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
