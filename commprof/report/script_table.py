"""Rich rendering of a `commprof profile` report: the script's iterations split per rank and across ranks
(the same tables as `commprof run`), its volume per op and group — with the ops only torch's flight record
holds, marked, and what that record says of the rest under it — each op's time (report/op_table.py), what
ran outside every iteration, what ran unseen (in neither count, where the record was read), and last the
findings. Rendering only: it reads the document commprof/profile/results.py made.
Exercised by: `pytest tests/test_profile_cli.py` and `pytest tests/unit/test_help_text.py -k epoch`.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from commprof.base.units import format_bytes
from commprof.report.fit import Narrowing
from commprof.report.op_table import op_table
from commprof.report.run_table import group_table, time_table


def _header(doc: dict) -> Text:
    env, cfg, steps = doc["env"], doc["config"], doc["steps"]
    args = " ".join([cfg["script"], *cfg["script_args"]])
    text = Text()
    text.append(f"commprof profile · {args} · backend {env['backend']} · {env['world_size']} rank(s)", style="bold")
    kept = steps.get("kept", steps["measured"])
    over = "measured iterations" if kept >= steps["measured"] else f"the last {kept} (--live keeps no more)"
    text.append(f"\n{steps['measured']} measured of {steps['found']} iterations found (warm-up {steps['warmup']}); "
                f"figures are medians over {over}")
    if env["oversubscribed"]:
        text.append(f"\nOVERSUBSCRIBED: {env['ranks_per_host']} ranks share {env['slots_per_host']} cores per "
                    "host; times include OS scheduling.", style="bold red")
    return text


def volume_table(doc: dict) -> Narrowing:
    """Volume per op and group: per iteration, and per epoch where --steps-per-epoch said how long one is; else
    over the whole run (every iteration the script ran, which is all commprof knows of its epochs)."""
    iterations = doc["steps"]["per_epoch"]
    if doc.get("config", {}).get("steps_per_epoch"):
        title, span = f"rank 0; {iterations} iterations per epoch", "epoch"
    else:
        title, span = f"rank 0; the whole run: {iterations} iterations; --steps-per-epoch N for per epoch", "run"
    table = Table(title=f"transfer volume per rank ({title})", title_justify="left")
    for label in ("op", "calls/iteration", "payload/iteration", "wire/iteration", f"payload/{span}", f"wire/{span}"):
        table.add_column(label, justify="left" if label == "op" else "right")
    record = doc.get("torch_record") or {}
    rows = [(name, v) for name, v in doc["volume"].items()]
    rows += [(f"{name} {MARK}", v) for name, v in (record.get("volume") or {}).items()]
    for name, v in rows:
        table.add_row(name, f"{v['calls_per_step']:g}", format_bytes(v["payload_bytes_per_step"]),
                      _bytes(v["wire_bytes_per_step"]), format_bytes(v["bytes_per_epoch"]),
                      _bytes(v["wire_bytes_per_epoch"]))
    if not rows:
        table.add_row("(none)", "0", "0 B", "0 B", "0 B", "0 B")
    said = record_note(record)
    if said:
        table.caption, table.caption_justify = said, "left"
    return Narrowing(table, (f"wire/{span}", f"payload/{span}"))


MARK = "*"
"""After an op in the volume table: counted from torch's flight record, not by commprof."""


def _bytes(n) -> str:
    """A byte count, or "?" where the measurement model has no wire bytes for the op (gather, scatter)."""
    return "?" if n is None else format_bytes(n)


def record_note(record: dict) -> str | None:
    """What torch's record of rank 0 says of the volume table: the ops it counted (marked), whether every other
    count is the record's too, and over how many iterations; None when the job has no record (an older JSON)."""
    if not record:
        return None
    if "rows" not in record:
        return f"torch's flight record: none ({record.get('why', 'not read')})"
    n, measured = record["iterations"], record["measured"]
    span = (f"its {n} measured iterations" if n == measured
            else f"the last {n} of {measured} measured iterations (its ring of {record['buffer_size']:,} ops reaches "
                 "back no further)")
    lines = []
    if record.get("volume"):
        lines.append(f"{MARK} counted from torch's flight record of rank 0: calls commprof did not count (a C++ call, "
                     "a form commprof cannot route)")
    differ = [r for r in record["rows"] if r["status"] in ("differ", "commprof only") and "why" not in r]
    if differ:
        lines.append("differs from torch's record: " + "; ".join(
            f"{r['key']} {r['commprof_calls']:,} calls, {format_bytes(r['commprof_payload_bytes'])} counted, "
            f"{r['record_calls']:,} calls, {format_bytes(r['record_payload_bytes'])} recorded" for r in differ))
    rows = record["rows"]
    said = f"torch's record of rank 0 over {span}: it holds {'the other calls' if differ else 'every call'} commprof "
    said += "counted"
    missing: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] == "commprof only" and "why" in r:
            missing.setdefault(r["why"], []).append(r["key"])
    said += "".join(f" but {', '.join(keys)} ({why})" for why, keys in missing.items())
    more = [r["key"] for r in rows if r["status"] in ("record more", "record only")]
    if more:
        said += f", and more ({MARK}): {', '.join(more)}"
    lines.append(said)
    return "\n".join(lines)


def outside_table(doc: dict) -> Table | None:
    outside = doc["outside_iterations"]
    if not outside:
        return None
    table = Table(title="outside every iteration (set-up, warm-up, after the last step; rank 0)",
                  title_justify="left")
    for label in ("op", "calls", "payload", "wire"):
        table.add_column(label, justify="left" if label == "op" else "right")
    for name, v in sorted(outside.items()):
        table.add_row(name, str(v["calls"]), format_bytes(v["payload_bytes"]), format_bytes(round(v["wire_bytes"])))
    return table


def summary_text(doc: dict) -> Text:
    s = doc["summary"]
    text = Text()
    text.append(f"{s['iteration_ms']:.2f} ms/iteration (slowest rank) · {s['iterations_per_s']:.2f} iterations/s")
    if "throughput" in s:
        text.append(f" · {s['throughput']:.1f} samples/s")
    steps = doc["steps"]
    if steps["measured"] == 0 and 0 < steps["found"] <= steps["warmup"]:
        text.append(f"\nno measured iteration: the script's {steps['found']} iteration(s) were all warm-up "
                    f"(--warmup {steps['warmup']}); pass a lower --warmup", style="bold yellow")
    elif steps["measured"] == 0:
        text.append("\nno measured iteration: no optimizer stepped (nor commprof.step()) after the warm-up",
                    style="bold yellow")
    record = doc.get("torch_record") or {}
    if "in_neither" in record:  # what torch's record of rank 0 holds is counted from it (the volume table)
        if record["in_neither"]:
            calls = ", ".join(f"{name} ×{n}" for name, n in sorted(record["in_neither"].items()))
            text.append(f"\nunseen (in neither commprof's count nor torch's record of rank 0's measured iterations; "
                        f"all ranks): {calls}", style="bold yellow")
    elif doc["unseen"]:
        calls = ", ".join(f"{name} ×{n}" for name, n in sorted(doc["unseen"].items()))
        text.append(f"\nunseen (ran as torch's own, neither timed nor counted; all ranks): {calls}",
                    style="bold yellow")
    return text


def profile_tables(doc: dict) -> list:
    """The header, then the tables: time per iteration, volume, the op times (where rank 0 traced), per group,
    outside every iteration, and the summary line."""
    ops = op_table(doc["op_times"], iterations=doc["steps"]["measured"]) if doc.get("op_times") else None
    extra = [t for t in (ops, group_table(doc), outside_table(doc)) if t is not None]
    return [_header(doc), time_table(doc), volume_table(doc), *extra, summary_text(doc)]


def print_profile(doc: dict) -> None:
    """The report on stdout: the tables, then the findings, which read them (the step they name is the tables')."""
    from commprof.report.findings_block import findings_text
    from commprof.report.fit import results_console

    console = results_console()
    for table in profile_tables(doc):
        console.print(table)
    found = findings_text(doc.get("findings"))
    if found is not None:
        console.print(found, highlight=False)
