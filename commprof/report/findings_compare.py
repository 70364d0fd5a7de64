"""Two runs' findings side by side (`commprof report A.json B.json`): each finding matched by what it names
(its kind and its rank, stage or op), its cost per step in each run, the change, and whether the change
exceeds the runs' own noise — the half-width of the 95 % confidence interval of each run's median step
(over its measured iterations, the slowest rank's wall each), the larger of the two. A finding in one run
only is "new" or "gone". Plain data (`compare`), then its table.

    commprof report before.json after.json

Exercised by: `pytest tests/unit/test_findings_recorded.py`.
"""

from __future__ import annotations

from collections import defaultdict

from rich.table import Table

from commprof.base.stats import median_ci
from commprof.base.units import format_bytes


def identity(f: dict) -> tuple:
    """What a finding is about, the same in two runs: kind, then rank, stage or op (name, group, size)."""
    return (f["kind"], f.get("rank"), f.get("stage"), f.get("op"), f.get("group"), f.get("bytes"))


def label(f: dict) -> str:
    kind, rank, stage, op, group, nbytes = identity(f)
    if op is not None:
        return f"{kind} {op} ({group}) {format_bytes(nbytes)}"
    if stage is not None:
        return f"{kind} stage {stage}"
    return kind if rank is None else f"{kind} rank {rank}"


def step_noise_ms(doc: dict) -> float | None:
    """Half-width of the 95 % CI of the run's median step (each step: the slowest rank's wall)."""
    walls: dict[int, float] = defaultdict(float)
    for it in doc.get("iterations") or []:
        walls[it["step"]] = max(walls[it["step"]], it["wall_ms"])
    if len(walls) < 2:
        return None
    lo, hi = median_ci(list(walls.values()))
    return (hi - lo) / 2


def compare(a: dict, b: dict) -> dict:
    """{"noise_ms", "rows": [{"finding", "a_ms", "b_ms", "change_ms", "verdict"}]} of two result documents
    (their "findings" blocks), the costliest in either run first; verdict: better, worse, within noise,
    new, gone."""
    noises = [n for n in (step_noise_ms(a), step_noise_ms(b)) if n is not None]
    noise = max(noises) if noises else 0.0
    found = [{identity(f): f for f in (d.get("findings") or {}).get("items") or []} for d in (a, b)]
    rows = []
    for key in dict.fromkeys([*found[0], *found[1]]):
        fa, fb = found[0].get(key), found[1].get(key)
        a_ms = fa["ms_per_step"] if fa else None
        b_ms = fb["ms_per_step"] if fb else None
        if fa is None or fb is None:
            verdict, change = ("new" if fa is None else "gone"), None
        else:
            change = b_ms - a_ms
            verdict = "within noise" if abs(change) <= noise else ("better" if change < 0 else "worse")
        rows.append({"finding": label(fa or fb), "a_ms": a_ms, "b_ms": b_ms, "change_ms": change,
                     "verdict": verdict})
    rows.sort(key=lambda r: -max(r["a_ms"] or 0.0, r["b_ms"] or 0.0))
    return {"noise_ms": noise, "rows": rows}


def compare_table(names: tuple[str, str], compared: dict) -> Table:
    """The comparison as a table whose columns are A and B, the title naming the files (paths are long)."""
    table = Table(title=f"findings, A → B in ms per step: A = {names[0]}, B = {names[1]}", title_justify="left",
                  caption=f"noise: a change within ±{compared['noise_ms']:.2f} ms, the larger half-width of the "
                          "two runs' 95 % CI of their median step, is within noise", caption_justify="left")
    for head in ("finding", "A", "B", "change", "verdict"):
        table.add_column(head, justify="left" if head in ("finding", "verdict") else "right")
    for r in compared["rows"]:
        table.add_row(r["finding"], _ms(r["a_ms"]), _ms(r["b_ms"]),
                      "" if r["change_ms"] is None else f"{r['change_ms']:+.2f}", r["verdict"])
    return table


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
