"""The fabric a prediction runs on: α (latency) and β (time per byte) per level — inside a host and
between hosts — and how many ranks share a host. Given as numbers or fitted from a `bench` JSON's
sendrecv rows (the same Hockney fit `bench --algo` uses).

    commprof predict run.json --fabric "intra=450GB/s,3us;inter=50GB/s,8us" --ranks-per-host 8
    commprof predict run.json --fabric bench.json

Exercised by: `pytest tests/unit/test_predict.py tests/test_bad_input.py`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.base.inputs import read_json, wrong_shape
from commprof.base.units import parse_rate

LEVELS = ("intra", "inter")
"""Inside one host, and between hosts."""

TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Level:
    """One level's point-to-point link: t(m) = α + β·m for m bytes each way."""

    alpha_s: float
    """Latency α of one message (seconds)."""
    beta_s_per_byte: float
    """Time per byte β (seconds per byte): 1/β is the bandwidth."""
    source: str
    """Where the figures came from: 'given', or the bench file and its fit's points."""

    def as_record(self) -> dict:
        return {"alpha_us": self.alpha_s * 1e6, "bandwidth_GBps": 1 / self.beta_s_per_byte / 1e9
                if self.beta_s_per_byte else None, "source": self.source}


@dataclass(frozen=True)
class Fabric:
    """The levels a prediction can use; a level that is None is unknown (an error once a group needs it)."""

    intra: Level | None
    """Between ranks on one host."""
    inter: Level | None
    """Between ranks on different hosts."""

    def level(self, name: str, flag: str) -> Level:
        found = getattr(self, name)
        if found is None:
            raise UsageError(f"{flag} gives no {name}-host level, and a group the prediction scales "
                             f"spans {'hosts' if name == 'inter' else 'ranks of one host'}")
        return found

    def as_record(self) -> dict:
        return {name: None if getattr(self, name) is None else getattr(self, name).as_record() for name in LEVELS}

    def rate_GBps(self, across_hosts: bool) -> float | None:
        """The bandwidth of the level an op crosses (GB/s); None when that level is unknown."""
        found = self.inter if across_hosts else self.intra
        return 1 / found.beta_s_per_byte / 1e9 if found is not None and found.beta_s_per_byte > 0 else None


def parse_time(text: str, flag: str) -> float:
    """'3us', '1.5 ms', '800ns' -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|ms|us|µs|ns)\s*", text)
    if not match:
        raise UsageError(f"cannot read latency {text!r} of {flag}: use a number with s, ms, us or ns, e.g. 5us")
    return float(match.group(1)) * TIMES[match.group(2)]


def parse(text: str, flag: str = "--fabric") -> Fabric:
    """A `--fabric` value: a bench JSON's path, or 'LEVEL=RATE,LATENCY' items joined by ';'."""
    if os.path.exists(text) or text.endswith(".json"):  # os.path: False, not OSError, for a spec too long for a path
        return from_bench(text, flag)
    levels: dict[str, Level] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in LEVELS:
            raise UsageError(f"cannot read {item!r} of {flag}: use intra=RATE,LATENCY;inter=RATE,LATENCY "
                             "(e.g. inter=50GB/s,8us), or a bench JSON")
        if name in levels:
            raise UsageError(f"{flag} gives the {name} level twice")
        rate, comma, latency = value.partition(",")
        if not comma:
            raise UsageError(f"{flag} {name}={value}: give a rate and a latency, e.g. {name}=50GB/s,8us")
        gbps = parse_rate(rate, flag)
        levels[name] = Level(alpha_s=parse_time(latency, flag), beta_s_per_byte=1 / (gbps * 1e9), source="given")
    if not levels:
        raise UsageError(f"{flag} names no level: use intra=RATE,LATENCY;inter=RATE,LATENCY")
    return Fabric(intra=levels.get("intra"), inter=levels.get("inter"))


def link_flag(text: str | None, flag: str = "--link-rate") -> Fabric | None:
    """run's and profile's --link-rate: one rate for every link ('25GB/s', '100Gbit/s'), a spec as --fabric
    takes it (a rate per level), or a bench JSON (its fitted levels); None without the flag."""
    if text is None:
        return None
    if "=" in text or os.path.exists(text) or text.endswith(".json"):
        return parse(text, flag)
    level = Level(alpha_s=0.0, beta_s_per_byte=1 / (parse_rate(text, flag) * 1e9), source="given")
    return Fabric(intra=level, inter=level)


def from_bench(path: str, flag: str = "--fabric") -> Fabric:
    """α–β per level fitted to the library sendrecv rows of a `commprof bench` JSON: rows of `--groups
    intra,inter` by their level; a plain sweep is inter-host when its ranks were one per host, intra-host
    when they shared one host."""
    from commprof.perfmodel.alphabeta import fit

    doc = read_json(path, "not a bench JSON", shown=f"{flag} {path}")
    rows = doc.get("results")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "collective" in r for r in rows):
        raise UsageError(f"{flag} {path}: not a bench JSON (no bench results)")
    levels = {}
    with wrong_shape(f"{flag} {path}", "not a bench JSON"):  # a field of another type, found as it is fitted
        env = doc.get("env") or {}
        plain = "inter" if len(env.get("hosts") or []) > 1 and env.get("ranks_per_host") == 1 else (
            "intra" if len(env.get("hosts") or []) == 1 else None)
        points: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r.get("collective") != "sendrecv" or r.get("algo", "library") != "library" or r.get("wrong"):
                continue
            level = r.get("level") if r.get("level") in LEVELS else plain
            if level is None:
                raise UsageError(f"{flag} {path}: its sendrecv pairs mix ranks on one host and across hosts; "
                                 "measure them apart with bench --groups intra,inter")
            points.setdefault(level, []).append((r["nbytes"], r["time_us"] * 1e-6))
        for level, pts in points.items():
            model = fit(pts)
            if model is not None:
                levels[level] = Level(alpha_s=model.alpha_s, beta_s_per_byte=model.beta_s_per_byte,
                                      source=f"{Path(path).name}: sendrecv fit over {model.points} sizes")
    if not levels:
        raise UsageError(f"{flag} {path}: no sendrecv sweep of two sizes or more to fit α and β from "
                         "(run bench sendrecv -b 8 -e 4M, or bench --algo)")
    return Fabric(intra=levels.get("intra"), inter=levels.get("inter"))
