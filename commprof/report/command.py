"""`commprof report FILE.json [FILE.json …]`: the tables and plots of saved results, without running
anything. One bench file: its tables as bench printed them (and a scaling table across rank counts);
several: side by side, each over the first (two backends, two machines, before/after). Run files and
grid files: one comparison table, a row per configuration; two run files with findings, their findings
side by side, each change against the runs' noise (report/findings_compare.py). Each PNG of --plot is said on stderr
(`plot: plots/bench-all_reduce.png`).

    commprof report grid.json --plot plots/
    commprof report gloo.json mpi.json
    commprof report grid.json --markdown > table.md
    commprof report a/run.json b/run.json c/run.json --csv runs.csv   (labels a, b, c; or --label each)
    commprof report live.jsonl --plot plots/            (a live job's log: report/live_log.py)

Exercised by: `pytest tests/unit/test_report_recorded.py tests/test_bad_input.py`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from commprof.base import flags
from commprof.base.errors import UsageError
from commprof.base.files import said
from commprof.base.inputs import read_json, wrong_shape

NOT_OURS = "not a commprof result"
"""What report says of a file it cannot use, before why."""


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("report", help=summary, description="""\
The tables and plots of saved results, without running anything. One bench file: its tables as bench
printed them (and a scaling table across rank counts); several: side by side, each against the first (two
backends, two machines, before and after). Run files and grid files: one comparison table, a row per
configuration; two run files with findings: their findings side by side, each change against the runs'
noise. --plot names each PNG it writes on stderr.

examples:
  commprof report grid.json --plot plots/
  commprof report gloo.json mpi.json
  commprof report grid.json --markdown > table.md
  commprof report a/run.json b/run.json --csv runs.csv  # labelled a and b
  commprof report live.jsonl --plot plots/              # a --live-log file
""")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="--json files of commprof bench, run or a grid; or one --live-log file")
    flags.add_plot_flag(p, launcher=False)
    p.add_argument("--markdown", action="store_true",
                   help="run and grid results: the comparison table as GitHub Markdown on stdout")
    p.add_argument("--link-rate", metavar="RATE",
                   help="the link's rate, drawn on the bench bus bandwidth panels: GB/s, or e.g. 200Gbit/s")
    p.add_argument("--label", action="append", metavar="LABEL",
                   help="a name for each FILE, in order (once a file); default: the file names, or the shortest "
                        "end of their paths that tells them apart (a/run.json b/run.json: a, b)")
    p.add_argument("--csv", metavar="PATH", help="the comparison table (or one bench file's results) as CSV")
    p.set_defaults(func=main)


def labels_of(paths: list[str], given: list[str] | None) -> list[str]:
    """Each file's name in the tables: --label's, or the shortest end of the paths that differs (the folders
    alone when every file has one name: one folder per experiment); UsageError for labels that do not fit."""
    if given:
        if len(given) != len(paths):
            raise UsageError(f"--label given {len(given)} time(s) for {len(paths)} file(s): give one a file")
        twice = sorted({g for g in given if given.count(g) > 1})
        if twice or not all(g.strip() for g in given):
            raise UsageError(f"--label {twice[0]!r} names two files: labels must differ" if twice
                             else "--label '': a label needs a character")
        return list(given)
    parts = [Path(p).resolve().with_suffix("").parts for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        labels = ["/".join(q[-k:]) for q in parts]
        if len(set(labels)) == len(labels):
            break
    else:  # one file given twice
        raise UsageError("report was given one file twice: " + ", ".join(paths))
    if k > 1 and len({q[-1] for q in parts}) == 1:  # one name in every folder: the folders tell them apart
        labels = [label.rpartition("/")[0] for label in labels]
    return labels


def load(path: str) -> tuple[str, dict]:
    """(kind, document) of one saved result: kind bench, run or grid; UsageError naming the file."""
    doc = read_json(path, NOT_OURS)
    if "runs" in doc and doc.get("command") in ("bench", "run"):
        kind = "grid"
    elif isinstance(doc.get("results"), list) and all(isinstance(r, dict) and "collective" in r
                                                        for r in doc["results"]):
        kind = "bench"
    elif isinstance(doc.get("summary"), dict) and "iterations" in doc:
        kind = "run"
    else:
        raise UsageError(f"{path}: not a commprof result (no bench results, run summary or grid runs)")
    if doc.get("complete") is not True:
        why = doc.get("reason") or "it was still being written or its job stopped early"
        raise UsageError(f"{path}: an incomplete result ({why})")
    return kind, doc


def main(args: argparse.Namespace) -> int:
    link = None
    if args.link_rate is not None:
        from commprof.base.units import parse_rate

        link = parse_rate(args.link_rate, "--link-rate")
        if not args.plot:
            raise UsageError("--link-rate is drawn on the --plot figures: give --plot DIR too")
    from commprof.report import live_log

    if any(live_log.looks_live(path) for path in args.files):
        if len(args.files) > 1:
            raise UsageError("report reads one live log at a time: " + ", ".join(args.files))
        if args.markdown or link is not None or args.label or args.csv:
            raise UsageError("--markdown, --link-rate, --label and --csv are for bench and run results, not a "
                             "live log")
        from commprof.report.fit import results_console

        log = live_log.read(args.files[0], NOT_OURS)
        with wrong_shape(args.files[0], NOT_OURS):
            for path in live_log.render(log, results_console(width=160), plot_dir=args.plot):
                said("plot", path)
        return 0
    labels = labels_of(args.files, args.label)
    if args.csv:
        from commprof.base.files import check_outputs

        check_outputs({"--csv": args.csv})
        read = {Path(p).resolve() for p in args.files}
        if Path(args.csv).resolve() in read:
            raise UsageError(f"--csv {args.csv} is one of the files read: give it a path of its own")
    loaded = [(label, *load(path)) for label, path in zip(labels, args.files)]
    # a field missing or of another type, found while the tables and plots read it: one line, exit 2
    with wrong_shape(args.files[0] if len(args.files) == 1 else "one of " + ", ".join(args.files), NOT_OURS):
        return _render(args, loaded, link)


def _render(args: argparse.Namespace, loaded: list[tuple[str, str, dict]], link: float | None) -> int:
    """The tables, plots and --csv of `loaded`: (label, kind, document) a file."""
    from rich.console import Console

    from commprof.report import compare
    from commprof.report.bench_summary import summarize, summary_table
    from commprof.report.bench_table import avg_busbw, bench_table, header, ranks_key
    from commprof.report.fit import results_console

    if link is not None and any(k == "run" or d.get("command") == "run" for _, k, d in loaded):
        raise UsageError("--link-rate is drawn on bench figures; these are run results")
    kinds = {kind if kind != "grid" else doc["command"] for _, kind, doc in loaded}
    if len(kinds) > 1:
        raise UsageError("report takes bench results or run results, not both: "
                         + ", ".join(f"{p} ({k})" for p, k, _ in loaded))
    out = results_console(width=220)
    if args.markdown and kinds == {"bench"}:
        raise UsageError("--markdown writes the run comparison table; these are bench results")
    if kinds == {"bench"}:
        docs = [d if k == "bench" else {"env": None, "results": d["results"]} for _, k, d in loaded]
        if len(docs) == 1:
            if docs[0]["env"]:
                out.print(header(docs[0]["env"]))
            by_coll: dict = {}
            for rec in docs[0]["results"]:
                # a table per collective, algorithm (--algo) and root (-r all), as bench printed them
                by_coll.setdefault((rec["collective"], rec.get("algo"), rec.get("root")), []).append(rec)
            for (coll, _, _), records in by_coll.items():
                out.print(bench_table(coll, records))
                out.print(f"# {coll} avg bus bandwidth: {avg_busbw(records):.3f} GB/s")
            if len({ranks_key(r) for r in docs[0]["results"]}) > 1:
                for table in compare.scaling_tables(docs[0]["results"]):
                    out.print(table)
            rows = summarize(docs[0]["results"])
            if rows:
                out.print(summary_table(rows))
            if args.csv:
                from commprof.base.files import write_csv

                write_csv(args.csv, docs[0]["results"])
        else:
            names = [p for p, _, _ in loaded]
            rows, table = compare.side_by_side(names, docs)
            out.print(table)
            if args.csv:
                from commprof.base.files import write_atomic

                write_atomic(args.csv, compare.side_by_side_csv(names, rows))
                said("csv", args.csv)
        if args.plot:
            from commprof.report import plots

            for path in plots.bench_plots([r for d in docs for r in d["results"]], args.plot, link_GBps=link):
                said("plot", path)
        return 0
    runs, grid = [], {}
    for path, kind, doc in loaded:
        if kind == "grid":
            runs += doc["runs"]
            grid.update(doc["grid"])
        else:
            runs.append({"label": path, "config": {}, "error": None, "result": doc})
    if not args.markdown:
        from commprof.report.findings_block import findings_text

        for path, kind, doc in loaded:
            found = findings_text(doc.get("findings")) if kind != "grid" else None
            if found is not None:  # a block of paragraphs, each wrapped with a hanging indent: on lines of its own
                if len(loaded) > 1:
                    out.print(f"{path}:", highlight=False)
                out.print(found, highlight=False)
        if len(loaded) == 2 and all(kind == "run" and doc.get("findings") for _, kind, doc in loaded):
            from commprof.report import findings_compare

            both = findings_compare.compare(loaded[0][2], loaded[1][2])
            out.print(findings_compare.compare_table((loaded[0][0], loaded[1][0]), both))
    if args.markdown:
        print(compare.run_markdown(compare.run_rows(runs)), end="")
        out = Console(quiet=True)  # the plots only
    for path in compare.render({"command": "run", "grid": grid, "runs": runs}, plot_dir=args.plot, console=out,
                               csv_path=args.csv):
        said("plot", path)
    if args.csv:
        said("csv", args.csv)
    return 0
