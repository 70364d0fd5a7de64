"""Rich rendering of a `commprof profile` report: the script's iterations split per rank and across ranks
(the same tables as `commprof run`), its volume per op and group, what ran outside every iteration, and
what ran unseen. Rendering only: it reads the document commprof/profile/results.py made.
Exercised by: `pytest tests/test_profile_cli.py`.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from commprof.report.fit import Narrowing
from commprof.report.run_table import group_table, time_table
from commprof.report.units import format_bytes


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
    table = Table(title=f"transfer volume per rank (rank 0; {doc['steps']['per_epoch']} iterations per epoch)",
                  title_justify="left")
    for label in ("op", "calls/iteration", "payload/iteration", "wire/iteration", "payload/epoch", "wire/epoch"):
        table.add_column(label, justify="left" if label == "op" else "right")
    for name, v in doc["volume"].items():
        table.add_row(name, f"{v['calls_per_step']:g}", format_bytes(v["payload_bytes_per_step"]),
                      format_bytes(v["wire_bytes_per_step"]), format_bytes(v["bytes_per_epoch"]),
                      format_bytes(v["wire_bytes_per_epoch"]))
    if not doc["volume"]:
        table.add_row("(none)", "0", "0 B", "0 B", "0 B", "0 B")
    return Narrowing(table, ("wire/epoch", "payload/epoch"))


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
    if doc["unseen"]:
        calls = ", ".join(f"{name} ×{n}" for name, n in sorted(doc["unseen"].items()))
        text.append(f"\nunseen (ran as torch's own, neither timed nor counted; all ranks): {calls}",
                    style="bold yellow")
    return text


def profile_tables(doc: dict) -> list:
    extra = [t for t in (group_table(doc), outside_table(doc)) if t is not None]
    return [_header(doc), time_table(doc), volume_table(doc), *extra, summary_text(doc)]


def print_profile(doc: dict) -> None:
    """The report on stdout: the findings first, then the tables."""
    from commprof.report.findings_block import findings_text
    from commprof.report.fit import results_console

    console = results_console()
    found = findings_text(doc.get("findings"))
    if found is not None:
        console.print(found, highlight=False)
    for table in profile_tables(doc):
        console.print(table)
