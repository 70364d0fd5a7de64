"""Rich rendering of bench results: nccl-tests' columns, out-of-place then in-place, one table per
collective, and a header that names the backend, the ranks and any oversubscription.

Rendering only: it reads records, never measures. Exercised by: `commprof bench --nproc 2 -e 64K`.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from commprof.report.fit import Fitting

MODE_NAMES = {False: "out of place", True: "in place"}
MODES = (False, True)
"""nccl-tests' order of the two modes' columns."""
NARROW_DROP = ("count", "redop", "root", "type", "p99 (us)", "algbw (GB/s)", "steps", "α–β model (us)",
               "sent/rank (B)", "slowest rank", ("time/model", "time/\nmodel"), "#wrong")
"""What a narrow terminal does, first to last (fit.fit_rows): leave out the count (the size over the type's
width), the type, redop and root where every row has the same (said once: "all rows: float32, sum"; where rows
differ in them they stay), the figures least looked at, wrap time/model's header, and leave out #wrong where
every row has the same. Kept are the size, each mode's time and busbw, and time/model: never a digit cut."""
LABELS = {"type": str, "redop": str, "root": "root {}".format, "#wrong": "#wrong {}".format}
"""The columns that tell rows apart, and how their one value is said when every row has it."""


def ranks_key(rec: dict) -> tuple[int, int, str]:
    """(ranks in each group, groups measuring at once, host level) of a bench record: (world size, 1, "")
    unless it ran under --group-sizes or --groups."""
    return rec.get("group_size", rec["world_size"]), rec.get("groups", 1), rec.get("level", "")


def several_roots(records: list[dict]) -> set[str]:
    """The collectives measured at more than one root (-r all): their rows are told apart by root."""
    seen: dict[str, set] = {}
    for rec in records:
        if rec.get("root") is not None:
            seen.setdefault(rec["collective"], set()).add(rec["root"])
    return {name for name, roots in seen.items() if len(roots) > 1}


def collective_label(collective: str, algo: str = "library", root: int | None = None) -> str:
    """'broadcast', 'all_reduce/ring', 'broadcast root 1' (given a root where several were measured)."""
    name = collective if algo == "library" else f"{collective}/{algo}"
    return name if root is None else f"{name} root {root}"


def ranks_label(key: tuple[int, int, str]) -> str:
    """'1 rank', '4 ranks', '4 groups of 2' for groups measuring at once; '2 groups of 2 intra-host'."""
    size, groups, level = key
    text = f"{groups} groups of {size}" if groups > 1 else f"{size} rank{'' if size == 1 else 's'}"
    return f"{text} {level}-host" if level else text


def header(env: dict) -> Text:
    """Lines above the tables: what ran where, and a warning when ranks share cores or GPUs."""
    hosts = env["hosts"]
    text = Text()
    text.append(f"commprof bench · backend {env['backend']} · {env['world_size']} rank(s) on "
                f"{len(hosts)} host(s) ({', '.join(hosts)}) · {env['clock']} timing · "
                f"torch {env['torch']}", style="bold")
    devices = sorted(set(env["devices"]))
    text.append(f"\ndevices: {', '.join(devices)}")
    if env.get("mpi_library"):
        text.append(f"\nMPI: {env['mpi_library']}")
    if (env.get("allocator") or {}).get("huge_pages"):
        text.append("\nhuge pages: torch's large CPU buffers on transparent huge pages (THP_MEM_ALLOC_ENABLE=1)")
    if env["oversubscribed"]:
        unit = "GPUs" if env["backend"] == "nccl" else "cores"
        text.append(f"\nOVERSUBSCRIBED: {env['ranks_per_host']} ranks share {env['slots_per_host']} {unit} "
                    "per host; times include OS scheduling, not only the fabric.", style="bold red")
    return text


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _wrong(rec: dict | None) -> Text:
    if rec is None:
        return Text("n/a", style="dim")
    if rec["wrong"] is None:
        return Text("N/A", style="dim")
    return Text(str(rec["wrong"]), style="bold red" if rec["wrong"] else "green")


def bench_table(collective: str, records: list[dict], notes: list[str] = ()) -> Fitting:
    """One table for one collective; records of both modes, in measurement order. Drawn narrower than its
    columns need, it takes NARROW_DROP's steps, in order, and says what it left out."""
    rows: dict[tuple, dict[bool, dict]] = {}
    for rec in records:
        rows.setdefault((rec["dtype"], rec["redop"], rec["nbytes"]), {})[rec["inplace"]] = rec
    first = records[0]
    algo = first.get("algo", "library")
    modelled = algo != "library"
    named = collective if not modelled else f"{collective} · algorithm {algo}"
    caption = list(notes) + ([model_note(first)] if modelled else [])
    barrier = collective == "barrier"
    modes = [m for m in MODES if any(r["inplace"] == m for r in records)] if not barrier else [False]
    if len(modes) == 1 and not barrier:  # the other mode's columns would be n/a throughout
        caption.append(f"{MODE_NAMES[modes[0]]} only: {first['backend']} has no {MODE_NAMES[not modes[0]]} "
                       f"{collective}" + ("" if not modelled else f" in {algo}"))
    key = ranks_key(first)
    ranks = ranks_label(key) + (f" of {first['world_size']}" if key != (first["world_size"], 1, "") else "")
    table = Table(title=f"{named} · {first['backend']} · {ranks} · "
                        f"time = {first['agg']} over ranks of the mean of {first['iters']} iterations",
                  caption="\n".join(caption) or None, caption_justify="left", header_style="bold")
    if not barrier:
        for name in ("size (B)", "count", "type", "redop", "root"):
            table.add_column(name, justify="right" if name != "type" else "left")
    for inplace in modes:
        table.add_column(f"{MODE_NAMES[inplace] if not barrier else ''}\ntime (us)", justify="right")
        if not barrier:
            for name in ("algbw (GB/s)", "busbw (GB/s)", "#wrong"):
                table.add_column(f"\n{name}", justify="right")
    if modelled:
        for name in ("steps", "sent/rank (B)", "α–β model (us)", "time/model"):
            table.add_column(f"\n{name}", justify="right")
    table.add_column("\np99 (us)", justify="right")
    table.add_column("slowest\nrank", justify="right")
    for (dtype, op, nbytes), by_mode in rows.items():
        ref = by_mode.get(False) or by_mode[True]
        cells: list = []
        if not barrier:
            root = "" if ref["root"] is None else str(ref["root"])
            cells += [str(nbytes), str(ref["count"]), dtype, op or "none", root]
        for inplace in modes:
            rec = by_mode.get(inplace)
            cells.append(_num(rec and rec["time_us"]))
            if not barrier:
                cells += [_num(rec and rec["algbw_GBps"]), _num(rec and rec["busbw_GBps"]), _wrong(rec)]
        if modelled:
            cells += _model_cells(ref)
        cells += [_num(ref["p99_us"]), str(ref["slowest_rank"])]
        table.add_row(*cells)
    return Fitting(table, NARROW_DROP, LABELS)


def _model_cells(rec: dict) -> list:
    """Steps, the most any rank sent (red when a rank's bytes differ from the formula), the α–β
    prediction and measured / predicted, for the first mode of a row."""
    sent, model = rec["sent_bytes"], rec["sent_bytes_model"]
    exact = sent == model
    cells = [str(rec["steps"]), Text(str(max(sent)), style="" if exact else "bold red")]
    cells += [_num(rec["model_us"]), _num(rec["time_over_model"])]
    return cells


def model_note(rec: dict) -> str:
    """What the α–β column was fitted from."""
    fit = rec.get("alpha_beta")
    if not fit:
        return "α–β model: no fit (the sendrecv sweep needs two sizes or more: give -b < -e)"
    bw = f", {fit['bandwidth_GBps']:.2f} GB/s" if fit["bandwidth_GBps"] else ""
    return (f"α–β model from this run's sendrecv sweep: α = {fit['alpha_us']:.2f} µs, "
            f"β = {fit['beta_ns_per_B']:.4f} ns/B{bw} (fit within {100 * fit['max_rel_err']:.0f} % "
            f"over {fit['points']} sizes); sent/rank = the most any rank sent in one call")


def avg_busbw(records: list[dict]) -> float:
    """nccl-tests' closing figure: the mean busbw over every measured row and mode."""
    values = [r["busbw_GBps"] for r in records if r["nbytes"]]
    return sum(values) / len(values) if values else 0.0
