"""Rich rendering of a `commprof run` report: the time split per rank and across ranks, the volume
measured next to predicted, and the training metrics. Rendering only: it reads the document
`commprof.run.results.combine` made. Exercised by: `commprof run --strategy ddp --nproc 2 --steps 6`.
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from commprof.base.units import format_bytes
from commprof.report.fit import Narrowing

COLUMNS = (("wall_ms", "wall ms"), ("data_ms", "data ms"), ("compute_ms", "compute ms"),
           ("comm_ms", "comm ms"), ("exposed_comm_ms", "exposed ms"), ("overlap_ms", "overlap ms"),
           ("overlap_pct", "overlap %"))
RANK_ROWS = 16
"""The most ranks the time table shows a row each: past it, rank 0 and each figure's slowest and fastest
rank, with quantile rows over every rank (a row per rank was 16,389 rows at 16,384 ranks)."""


def _header(doc: dict) -> Text:
    env, cfg, steps, model = doc["env"], doc["config"], doc["steps"], doc["model"]
    text = Text()
    text.append(f"commprof run · {cfg['strategy']} · {cfg['model']} ({model['trainable_parameters']:,} trainable "
                f"of {model['parameters']:,} params) · backend {env['backend']} · {env['world_size']} rank(s) · "
                f"global batch {steps['global_batch']} · {cfg['precision']}", style="bold")
    text.append(f"\n{steps['measured']} measured of {steps['total']} steps (warm-up {cfg['warmup']}); "
                f"{steps['per_epoch']} steps per epoch; figures are medians over measured steps")
    if env["oversubscribed"]:
        text.append(f"\nOVERSUBSCRIBED: {env['ranks_per_host']} ranks share {env['slots_per_host']} cores per "
                    "host; times include OS scheduling.", style="bold red")
    return text


def time_table(doc: dict) -> Narrowing:
    """Per rank and across ranks; a narrow terminal goes without peak RSS, peak mem and overlap ms first."""
    s = doc["summary"]
    columns = COLUMNS + ((("bubble_ms", "bubble ms"),) if doc.get("pipeline") or s["bubble_ms"] > 0 else ())
    if "other_ms" in s:  # a document of an older commprof has none
        columns = (*columns[:5], ("other_ms", "other ms"), *columns[5:])
    every = s["per_rank"]
    shown = outliers(every, [k for k, _ in columns])
    title = "time per iteration"
    if len(shown) < len(every):
        title += (f" ({len(shown)} of {len(every):,} ranks: rank 0 and each figure's slowest and fastest; "
                  "p50, p90 and p99 over every rank)")
    table = Table(title=title, title_justify="left")
    table.add_column("rank", justify="right")
    for _, label in columns:
        table.add_column(label, justify="right")
    table.add_column("peak mem", justify="right")
    table.add_column("peak RSS", justify="right")
    for row in shown:
        where = " ".join(f"{k}{v}" for k, v in row["coords"].items()) if len(row["coords"]) > 1 else ""
        table.add_row(f"{row['rank']} {where}".strip(), *[f"{row[k]:.2f}" for k, _ in columns],
                      format_bytes(row["peak_mem_bytes"]), format_bytes(row["peak_rss_bytes"]))
    if len(s["per_rank"]) > 1:
        ranks = s["across_ranks"]
        for stat in ("avg", "min", "max", "skew"):
            table.add_row(stat, *[f"{ranks[k][stat]:.2f}" for k, _ in columns], "", "",
                          style="bold" if stat == "avg" else "")
        table.add_row("slowest", *[str(ranks[k]["slowest_rank"]) for k, _ in columns], "", "", style="dim")
        if len(shown) < len(every):
            for q in (50, 90, 99):
                table.add_row(f"p{q}", *[f"{quantile([r[k] for r in every], q / 100):.2f}" for k, _ in columns],
                              "", "", style="dim")
    return Narrowing(table, ("peak RSS", "peak mem", "overlap ms", "data ms", "other ms"))


def outliers(rows: list[dict], fields: list[str]) -> list[dict]:
    """`rows` (one a rank) when RANK_ROWS or fewer; else rank 0's and, figure by figure, the rows of its
    largest and smallest value, up to RANK_ROWS, in rank order."""
    if len(rows) <= RANK_ROWS:
        return rows
    picked = {rows[0]["rank"]: None}
    for k in fields:
        for row in (max(rows, key=lambda r: r[k]), min(rows, key=lambda r: r[k])):
            if len(picked) < RANK_ROWS:
                picked.setdefault(row["rank"])
    return [r for r in rows if r["rank"] in picked]


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank)."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def group_table(doc: dict) -> Table | None:
    """Comm time per group (model-parallel runs: dp, pp boundaries, tp), averaged over the ranks in it."""
    groups = doc["summary"]["comm_by_group_ms"]
    if set(groups) <= {"world"}:
        return None
    table = Table(title="comm per group (ms/iteration)", title_justify="left")
    table.add_column("group")
    table.add_column("comm ms", justify="right")
    for g, v in groups.items():
        table.add_row(g, f"{v:.2f}")
    return table


def pipeline_tables(doc: dict) -> list:
    p = doc.get("pipeline")
    if not p:
        return []
    stages = Table(title=f"pipeline · {p['schedule']} · {p['stages']} stages × {p['micro_batches']} micro-batches · "
                         f"bubble {100 * p['bubble_fraction']:.1f}% measured vs "
                         f"{100 * p['predicted_bubble_fraction']:.1f}% predicted (p−1)/(m+p−1)", title_justify="left")
    for label in ("stage", "rank", "layers", "bubble ms", "schedule ms", "bubble %", "in flight",
                  "act/micro", "peak act", "peak mem"):
        stages.add_column(label, justify="right")
    for st in p["per_stage"]:
        stages.add_row(str(st["stage"]), str(st["rank"]), f"{st['layers'][0]}–{st['layers'][1]}",
                       f"{st['bubble_ms']:.2f}", f"{st['schedule_ms']:.2f}", f"{100 * st['bubble_fraction']:.1f}",
                       str(st["peak_micro_batches_in_flight"]), format_bytes(st["activation_bytes_per_micro"]),
                       format_bytes(st["peak_activation_bytes"]), format_bytes(st["peak_mem_bytes"]))
    bounds = Table(title="activations across stage boundaries per step (measured vs predicted)", title_justify="left")
    for label in ("boundary", "shape/micro", "dtype", "bytes/micro", "activations", "predicted", "gradients",
                  "predicted"):
        bounds.add_column(label, justify="left" if label == "boundary" else "right")
    for b in p["boundaries"]:
        ok_a = b["activation_bytes_per_step"] == b["predicted_activation_bytes_per_step"]
        ok_g = b["grad_bytes_per_step"] == b["predicted_grad_bytes_per_step"]
        bounds.add_row(b["boundary"], "×".join(map(str, b["shape"])), b["dtype"], format_bytes(b["bytes_per_micro"]),
                       format_bytes(b["activation_bytes_per_step"]),
                       Text(format_bytes(b["predicted_activation_bytes_per_step"]),
                            style="green" if ok_a else "yellow"),
                       format_bytes(b["grad_bytes_per_step"]),
                       Text(format_bytes(b["predicted_grad_bytes_per_step"]), style="green" if ok_g else "yellow"))
    return [Narrowing(stages, ("peak act", "act/micro", "in flight", "peak mem", "schedule ms")),
            Narrowing(bounds, ("shape/micro", "dtype", "bytes/micro"))]


def volume_table(doc: dict) -> Narrowing:
    table = Table(title="transfer volume per rank (measured vs predicted)", title_justify="left")
    for label in ("op", "calls/step", "payload/step", "predicted", "wire/step", "predicted wire",
                  "payload/epoch", "wire/epoch"):
        table.add_column(label, justify="left" if label == "op" else "right")
    for name, v in doc["volume"].items():
        match = v["payload_bytes_per_step"] == v["predicted_payload_bytes_per_step"]
        table.add_row(name, f"{v['calls_per_step']:g}", format_bytes(v["payload_bytes_per_step"]),
                      Text(format_bytes(v["predicted_payload_bytes_per_step"]), style="green" if match else "yellow"),
                      format_bytes(v["wire_bytes_per_step"]), format_bytes(v["predicted_wire_bytes_per_step"]),
                      format_bytes(v["bytes_per_epoch"]), format_bytes(v["wire_bytes_per_epoch"]))
    if not doc["volume"]:
        table.add_row("(none)", "0", "0 B", "0 B", "0 B", "0 B", "0 B", "0 B")
    return Narrowing(table, ("wire/epoch", "payload/epoch", "predicted wire"))


def metrics_text(doc: dict) -> Text:
    s, m = doc["summary"], doc["metrics"]
    text = Text()
    rate = f"{s['throughput']:.1f} samples/s"
    if "tokens_per_s" in s:
        rate += f" ({s['tokens_per_s']:.0f} tokens/s)"
    text.append(f"throughput {rate} · {s['iteration_ms']:.2f} ms/iteration · {s['epoch_s']:.1f} s/epoch "
                f"(slowest rank) · loss {m['loss'][0]:.4f} → {m['final_loss']:.4f}")
    if doc["config"]["loss_threshold"] is not None:
        reached = m["steps_to_threshold"]
        text.append(f" · loss ≤ {doc['config']['loss_threshold']:g} "
                    + (f"at step {reached}" if reached else "not reached"))
    if m["accuracy"] is not None:
        unit = "tokens" if "tokens_per_s" in s else "samples"
        text.append(f" · held-out accuracy {100 * m['accuracy']:.2f}% of {m['eval_samples']} {unit}")
    if m["skipped_steps"]:
        text.append(f" · {m['skipped_steps']} step(s) skipped (fp16 overflow)")
    return text


def run_tables(doc: dict) -> list:
    groups = group_table(doc)
    return [_header(doc), time_table(doc), *([groups] if groups else []), volume_table(doc), *pipeline_tables(doc),
            metrics_text(doc)]


def models_table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table(title="models (--model)", title_justify="left")
    for label in ("name", "input", "description"):
        table.add_column(label)
    for name, kind, description in rows:
        table.add_row(name, kind, description)
    return table
