"""The one label scheme: what every range commprof emits is called, its category and colour, and the
push/pop that puts it in NVTX (for Nsight Systems) and — when a trace or the torch profiler is attached — in
the Chrome trace and the Kineto trace, so Nsight, both traces and the tables use the same names.

Domain `commprof`. Categories and their fixed colours:

  iteration   one training iteration                 "iteration 3"; and "measured" around every
              measured iteration (run) or the sweep (bench): Nsight's capture range
  data        the input pipeline                     "data"
  compute     forward, backward, recompute           "forward"
  optimizer   the optimizer step                     "step"
  comm        a collective or point-to-point op      "all_reduce (dp) 1 MiB float32", payload = bytes
  bubble      a pipeline send/recv (the stage idles) "recv (pp 0→1) 20 KiB float32", payload = bytes
  wait        blocked on an async op                 "wait all_reduce (world)"
  kernel      one step of a hand-written algorithm   "ring::reduce_scatter::step2"

Nesting: iteration › phase › op › algorithm step › the step's ops. Under an NVTX tool every op is also an
in-flight range, issue → completion, in its group's domain `commprof comm (<group>)` (IN_FLIGHT_DOMAIN).
Exercised by: `pytest tests/test_nvtx_run.py tests/test_trace.py tests/test_nsys.py`.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import nvtx
from nvtx._lib.lib import Domain, DomainHandle, DummyDomain

from commprof.base.measurement import BUBBLE_P2P
from commprof.base.units import format_bytes

DOMAIN = "commprof"

COLORS = {
    "iteration": 0xFF9E9E9E,
    "data": 0xFF00BCD4,
    "compute": 0xFF4CAF50,
    "optimizer": 0xFF8BC34A,
    "comm": 0xFFF44336,
    "bubble": 0xFF9C27B0,
    "wait": 0xFFFF9800,
    "kernel": 0xFF795548,
}
"""ARGB per category: fixed, so every report of every run looks the same."""

PHASE_CATEGORY = {"data": "data", "step": "optimizer"}
"""Phases outside `compute` (forward, backward, recompute and anything else are compute)."""

MEASURED = "measured"
"""The range around what is measured; `commprof nsys` captures exactly it."""

IN_FLIGHT_DOMAIN = "commprof comm ({group})"
"""The NVTX domain of one group's in-flight ranges: every op again, from issue to completion, as a start/end
range (an async op's ends on the thread that sees it complete). A domain of its own, because Nsight Systems
gives each domain its own row: these ranges overlap the calling thread's push/pop ranges, which stay."""


class InFlight(NamedTuple):
    """An op's in-flight range: its attributes in its group's IN_FLIGHT_DOMAIN, and that domain's start_range
    and end_range (bound methods: the op path calls them without a lookup)."""

    attrs: object
    start: object
    end: object


class Label(NamedTuple):
    """A range's name as every output shows it, and its NVTX attributes (None with no tool attached)."""

    message: str
    category: str
    payload: int | None
    attrs: object


def op_message(name: str, nbytes: int, dtype_name: str | None, group: str) -> str:
    """'all_reduce (dp) 1 MiB float32'; 'barrier (world)'."""
    if dtype_name is None:
        return f"{name} ({group})"
    return f"{name} ({group}) {format_bytes(nbytes)} {dtype_name}"


def op_category(name: str, group: str) -> str:
    """A pipeline's send/recv is bubble (its stage is idle on a neighbour); every other op is comm."""
    return "bubble" if name in BUBBLE_P2P and group.startswith("pp") else "comm"


def phase_category(name: str) -> str:
    return PHASE_CATEGORY.get(name, "compute")


def open_domain(name: str = DOMAIN):
    """The nvtx package's domain `name`: a no-op DummyDomain when no tool is attached (or NVTX_DISABLE
    is set), else a live one — also under a tool that declines NVTX's payload extension."""
    domain = nvtx.get_domain(name)
    if isinstance(domain, DummyDomain) and nvtx.enabled() and os.environ.get("NVTX_INJECTION64_PATH"):
        # Nsight Systems before 2024 declines the payload extension, so the package's
        # nvtxDomainIsEnabled check answers 0 and it would drop every range although the tool records
        # plain push/pop: build the domain past that check.
        domain = object.__new__(Domain)
        domain.handle = DomainHandle(name)
        domain.__init__(name)
    return domain


class Annotator:
    """NVTX push/pop in domain `commprof` with cached attributes; with `trace` set (a TraceRecorder),
    every range is also recorded, stamped with perf_counter_ns just before its push and its pop."""

    def __init__(self) -> None:
        self.domain = open_domain()
        self._labels: dict = {}
        self._in_flight_domains: dict = {}
        self.in_flight = not isinstance(self.domain, DummyDomain)
        """Whether ops get in-flight ranges: an NVTX tool is attached (read when a Comm first labels an op)."""
        self._trace = None
        self._kineto = None
        self.active = not isinstance(self.domain, DummyDomain)
        """Whether a push goes anywhere: an NVTX tool is attached, a trace or the torch profiler is on. Comm's
        per-op path skips push and pop when not (two calls that do nothing cost it about 1 µs, right after a
        gloo op)."""

    @property
    def trace(self):
        """A commprof.record.trace.TraceRecorder while --trace is on, else None."""
        return self._trace

    @trace.setter
    def trace(self, trace) -> None:
        self._trace = trace
        self._sinks_changed()

    @property
    def kineto(self):
        """A commprof.run.kineto.Ranges while --torch-profiler is on (every range is also a Kineto user
        annotation), else None."""
        return self._kineto

    @kineto.setter
    def kineto(self, kineto) -> None:
        self._kineto = kineto
        self._sinks_changed()

    def _sinks_changed(self) -> None:
        """Set `active`, and bind push and pop to the trace's own when it is the only place a range goes (every
        op pushes two ranges, issue and wait, and a Python call costs about 1 µs right after a gloo op)."""
        nvtx_on = not isinstance(self.domain, DummyDomain)
        self.active = self._trace is not None or self._kineto is not None or nvtx_on
        self.__dict__.pop("push", None)
        self.__dict__.pop("pop", None)
        if self._trace is not None and self._kineto is None and not nvtx_on:
            self.push, self.pop = self._trace.enter, self._trace.exit

    def label(self, message: str, category: str, payload: int | None = None, *, cached: bool = True) -> Label:
        """The label of `message`, made once and kept for the next call; `cached=False` for a message used once
        (an iteration's number), which a job of any length would otherwise keep one of per step."""
        key = (message, category, payload)
        hit = self._labels.get(key)
        if hit is None:
            attrs = self.domain.get_event_attributes(message=message, color=COLORS[category], category=category,
                                                     payload=payload)
            hit = Label(message, category, payload, attrs)
            if cached:
                self._labels[key] = hit
        return hit

    def in_flight_range(self, label: Label, group: str) -> InFlight | None:
        """The in-flight range of an op labelled `label` on group `group`: the same message, category, colour
        and payload, in that group's own domain; None when ops get none (no NVTX tool attached)."""
        if not self.in_flight:
            return None
        domain = self._in_flight_domains.get(group)
        if domain is None:
            domain = self._in_flight_domains[group] = open_domain(IN_FLIGHT_DOMAIN.format(group=group))
        attrs = domain.get_event_attributes(message=label.message, color=COLORS[label.category],
                                            category=label.category, payload=label.payload)
        return InFlight(attrs, domain.start_range, domain.end_range)

    def push(self, label: Label) -> None:
        if self._kineto is not None:  # outside the trace's stamps and NVTX's range: they measure none of it
            self._kineto.push(label)
        if self._trace is not None:  # stamped just before the push, as the pop is just before the pop:
            self._trace.begin(label, time.perf_counter_ns())  # both sides then carry the same call cost
        self.domain.push_range(label.attrs)

    def pop(self) -> int | None:
        """Pop the innermost range; the perf_counter_ns the trace ended it at (None without a trace)."""
        trace = self._trace
        t_ns = None if trace is None else time.perf_counter_ns()
        due = trace is not None and trace.end(t_ns)
        self.domain.pop_range()
        if self._kineto is not None:
            self._kineto.pop()
        if due:  # the trace's writing after the pop: inside no range it stamps, NVTX's or its own
            trace.flush()
        return t_ns

    def pop_unfinished(self, end_ns: int | None = None) -> None:
        """Pop a range that turned out other than its push said (the iteration a profiled script's last
        optimizer step began, ended by no step): NVTX's goes as pushed; the trace ends it at `end_ns` (the
        last real iteration's end, for the range around them), or leaves it out when None."""
        trace = self._trace
        if trace is not None:
            trace.end_unfinished(end_ns)
        self.domain.pop_range()
        if self._kineto is not None:
            self._kineto.pop()


ANNOTATOR = Annotator()
"""The process's one annotator: NVTX and the trace are per process, like the domain itself."""


class Range:
    """`with Range(label):` — one pushed range; cheap enough for every algorithm step."""

    __slots__ = ("_label",)

    def __init__(self, label: Label) -> None:
        self._label = label

    def __enter__(self) -> None:
        ANNOTATOR.push(self._label)

    def __exit__(self, *exc) -> None:
        ANNOTATOR.pop()
