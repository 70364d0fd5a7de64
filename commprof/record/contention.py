"""Whether anything besides the job used this host's cores while it measured: another job, a build, a
busy loop. Timings taken then measure the competition too (two overlapping MPI jobs each saw an 8 B
all_reduce at ~8,000 µs instead of ~3 µs), so a report says so under its tables and in its JSON
(`env.contention`).

The CPU time the whole host spent (/proc/stat, every core) minus what the job's own ranks on this host spent
(/proc/PID/stat, every thread), over the measurement, per second of it: the cores others used. Hypervisor
steal is counted apart. Rank 0 measures its own host. Exercised by: `pytest tests/test_signals.py -k contention`.
"""

from __future__ import annotations

import os
import socket
import time

CONTENDED_CORES = 0.25
"""Others' average use of the host above which a measurement is reported as contended."""
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _host_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of every core since boot, or None where /proc/stat is not there."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def _process_ticks(pid: int) -> int:
    """User + system ticks of `pid`'s threads; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


class Contention:
    """Started when the measurement starts; `read()` any time after, as often as needed."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = list(pids)
        self._start = self._lap = self._sample()

    def _sample(self) -> tuple:
        return time.monotonic(), _host_ticks(), sum(_process_ticks(p) for p in self._pids)

    def read(self) -> dict | None:
        """Plain data for the report: the host, seconds measured, cores used by others and stolen on
        average, and whether that counts as contended; None where the host cannot tell."""
        return self._between(self._start, self._sample())

    def lap(self) -> dict | None:
        """As read(), since the previous lap (or the start): a live window's own (live/monitor.py)."""
        now = self._sample()
        reading = self._between(self._lap, now)
        self._lap = now
        return reading

    @staticmethod
    def _between(first: tuple, second: tuple) -> dict | None:
        t0, host0, own0 = first
        t1, host1, own1 = second
        if host0 is None or host1 is None or t1 <= t0:
            return None
        wall = t1 - t0
        others = max(0.0, ((host1[0] - host0[0]) - (own1 - own0)) / _TICK / wall)
        steal = (host1[1] - host0[1]) / _TICK / wall
        return {"host": socket.gethostname(), "seconds": round(wall, 3), "others_cores": round(others, 3),
                "steal_cores": round(steal, 3), "contended": others + steal >= CONTENDED_CORES}


def note(reading: dict | None) -> str | None:
    """The line under a report's tables when its measurement was contended."""
    if not reading or not reading["contended"]:
        return None
    return (f"note: contended: other processes used {reading['others_cores']:.2f} core(s) of {reading['host']} "
            f"on average while this measured (hypervisor steal {reading['steal_cores']:.2f}): the timings include "
            "that competition")
