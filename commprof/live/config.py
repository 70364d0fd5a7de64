"""What `--live` asks of a job, as its flags declare it: the window, the endpoint and the log.

    commprof profile --nproc 8 --live --live-log live.jsonl -- train.py
    commprof profile --nproc 8 --live --metrics-port 0.0.0.0:9464 -- train.py    # listened to from elsewhere
    commprof profile --live --metrics-port 0.0.0.0:9464 --metrics-targets targets.json -- train.py  # hosts

Exercised by: `pytest tests/unit/test_live.py`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from commprof.base.errors import UsageError

WINDOW = 20
"""Steps a window holds by default. Its figures are medians, and a median of 20 steps shrugs off a hiccup of
a few; at steps of 50 ms to 1 s a window is 1-20 s, about one Prometheus scrape (15 s by default), and a rank
that turns slow is named within two windows: 40 steps."""
PORT = 9464
"""--metrics-port's default: the port OpenTelemetry's Prometheus exporter takes by default."""
ADDRESS = "127.0.0.1"
"""Where the endpoint listens unless --metrics-port names an address: this host only."""


@dataclass(frozen=True)
class LiveConfig:
    """A live job's settings (--live and the flags beside it)."""

    window: int = WINDOW
    """Measured steps per window (--live-window)."""
    address: str | None = ADDRESS
    """The address the Prometheus endpoint listens on; None: no endpoint (--metrics-port off)."""
    port: int = PORT
    """Its port (0: any free one, said on stderr)."""
    log: str | None = None
    """The JSON Lines file of windows (--live-log); None: none."""
    linger_s: float = 0.0
    """Seconds the endpoint stays after the job, for a last scrape (--live-linger)."""
    targets: str | None = None
    """Prometheus' file_sd JSON listing every host's endpoint, written by rank 0 (--metrics-targets); None: none."""
    about: tuple[tuple[str, str], ...] = ()
    """What the job runs, as labels of commprof_build_info: (("command", "run"), ("workload", "ddp")) — the
    strategy, or the script's file name."""


def add_live_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--live", action="store_true",
                   help="while the job runs: every window of steps, its figures and findings on a Prometheus "
                        "endpoint, in --live-log and on the terminal (docs/live.md)")
    p.add_argument("--live-window", type=int, default=WINDOW, metavar="STEPS",
                   help=f"measured steps per live window (default {WINDOW})")
    p.add_argument("--metrics-port", default=str(PORT), metavar="[ADDR:]PORT",
                   help=f"the live Prometheus endpoint (default {ADDRESS}:{PORT}; 0: any free port; off: none)")
    p.add_argument("--live-log", metavar="FILE", help="append every live window to FILE as a JSON line")
    p.add_argument("--metrics-targets", metavar="FILE",
                   help="a job of several hosts serves each host's ranks on that host's endpoint: write their "
                        "addresses to FILE for Prometheus' file_sd_configs")
    p.add_argument("--live-linger", type=float, default=0.0, metavar="SECONDS",
                   help="keep the endpoint this long after the job ends, for a last scrape (default 0)")


def live_config(args: argparse.Namespace) -> LiveConfig | None:
    """The --live flags checked (UsageError naming the flag); None without --live."""
    given = [flag for flag, value, default in (("--live-window", args.live_window, WINDOW),
                                               ("--metrics-port", args.metrics_port, str(PORT)),
                                               ("--live-log", args.live_log, None),
                                               ("--metrics-targets", args.metrics_targets, None),
                                               ("--live-linger", args.live_linger, 0.0)) if value != default]
    if not args.live:
        if given:
            raise UsageError(f"{given[0]} is a --live flag: give --live too")
        return None
    if args.live_window < 1:
        raise UsageError(f"--live-window {args.live_window}: a window holds at least 1 step")
    if not 0 <= args.live_linger <= 3600:
        raise UsageError(f"--live-linger {args.live_linger:g}: between 0 and 3600 seconds")
    address, port = metrics_address(args.metrics_port)
    if args.metrics_targets is not None and address is None:
        raise UsageError("--metrics-targets lists the endpoints: not with --metrics-port off")
    script = getattr(args, "script", None)
    about = (("command", "profile"), ("workload", os.path.basename(script))) if script else \
        (("command", "run"), ("workload", str(getattr(args, "strategy", ""))))
    return LiveConfig(window=args.live_window, address=address, port=port, log=args.live_log,
                      linger_s=args.live_linger, targets=args.metrics_targets, about=about)


def metrics_address(spec: str) -> tuple[str | None, int]:
    """--metrics-port's value: (address, port), (None, 0) for off."""
    if spec == "off":
        return None, 0
    address, _, port = spec.rpartition(":")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:  # not '²', not Arabic-Indic digits
        raise UsageError(f"--metrics-port {spec!r}: a port 0-65535, ADDR:PORT, or off")
    return address.strip("[]") or ADDRESS, int(port)
