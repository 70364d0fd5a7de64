"""Records the fast lane's fixtures: real commprof jobs on this machine, their JSON, trace folders and
printed output kept in tests/recorded/, each listed in tests/recorded/README.md with the command that made it.
The fast lane (tests/unit/) reads them back and starts no process itself.

    python tests/support/record.py            # every fixture again (a few minutes at 2 ranks)
    python tests/support/record.py slowed     # one of them
    python tests/support/record.py --findings # the traced profiles' findings made again from their traces

A fixture is recorded whole or not at all: each job writes to a temporary folder that replaces the old one only
when the job exited 0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
OUT = TESTS / "recorded"
SCRIPTS = TESTS / "scripts"
BENCH = ("all_reduce", "all_gather", "broadcast", "-b", "8", "-e", "1M", "-f", "8", "-n", "3", "-w", "1")
RUN = ("--steps", "4", "--warmup", "1", "--batch-size", "8", "--samples", "256", "--eval-samples", "0")
STRAGGLER_DELAY_MS = 20

FIXTURES: dict[str, tuple[tuple[str, ...], str]] = {
    # name -> (commprof's arguments, with {out} for the fixture's folder; what the fixture is for)
    "bench-1": (("bench", *BENCH, "--nproc", "1", "--json", "{out}/bench.json"),
                "a bench sweep at 1 rank: tables, summary, plots"),
    "bench-2": (("bench", *BENCH, "--nproc", "2", "--json", "{out}/bench.json"),
                "the same sweep at 2 ranks: tables, report of two files, plots"),
    "bench-2-again": (("bench", *BENCH, "--nproc", "2", "--json", "{out}/bench.json"),
                      "bench-2 run again: report's two files side by side"),
    "sendrecv": (("bench", "sendrecv", "-b", "1K", "-e", "1M", "-f", "4", "-n", "3", "-w", "1", "--nproc", "2",
                  "--json", "{out}/bench.json"), "a sendrecv sweep: the α–β fabric fitted from a bench JSON"),
    "ddp": (("run", "--strategy", "ddp", "--nproc", "2", *RUN, "--json", "{out}/run.json", "--trace", "{out}/trace"),
            "a traced DDP run: predict's replay, run tables and plots"),
    "ddp-bs16": (("run", "--strategy", "ddp", "--nproc", "2", *RUN[:4], "--batch-size", "16", *RUN[6:],
                  "--json", "{out}/run.json"), "the same DDP run at batch 16: plots of several runs"),
    "fsdp": (("run", "--strategy", "fsdp", "--nproc", "2", *RUN, "--json", "{out}/run.json", "--trace", "{out}/trace"),
             "a traced FSDP run: predict's replay"),
    "pipeline": (("run", "--strategy", "pipeline-1f1b", "--nproc", "4", "--dp", "2", *RUN, "--json", "{out}/run.json",
                  "--trace", "{out}/trace"), "a traced 2×2 pipeline run: predict's replay"),
    "single": (("run", "--strategy", "single", "--nproc", "1", *RUN, "--json", "{out}/run.json", "--trace",
                "{out}/trace"), "one process, traced: no data-parallel group to predict"),
    "slowed": (("profile", "--nproc", "2", "--warmup", "1", "--trace", "{out}/trace", "--json", "{out}/profile.json",
                "--", str(SCRIPTS / "straggler_train.py"), "--steps", "12", "--delay-ms", str(STRAGGLER_DELAY_MS)),
               f"DDP with rank 1 sleeping {STRAGGLER_DELAY_MS} ms before every backward: the straggler's findings"),
    "balanced": (("profile", "--nproc", "2", "--trace", "{out}/trace", "--json", "{out}/profile.json", "--",
                  str(SCRIPTS / "straggler_train.py"), "--steps", "12"), "the same job without the delay"),
    "per-param": (("profile", "--nproc", "2", "--trace", "{out}/trace", "--json", "{out}/profile.json", "--",
                   str(SCRIPTS / "per_param_train.py"), "--steps", "12"),
                  "every gradient all-reduced on its own: latency-bound findings"),
    "fused": (("profile", "--nproc", "2", "--json", "{out}/profile.json", "--", str(SCRIPTS / "per_param_train.py"),
               "--steps", "12", "--fused"), "the same gradients fused into one all-reduce"),
}


def record(name: str) -> None:
    args, _ = FIXTURES[name]
    with tempfile.TemporaryDirectory(prefix=f"record-{name}-", dir=OUT) as tmp:
        argv = [a.replace("{out}", tmp) for a in args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
        proc = subprocess.run([sys.executable, "-m", "commprof", *argv], env=env, capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            sys.exit(f"record {name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        (Path(tmp) / "stdout.txt").write_text(proc.stdout)
        _relative(Path(tmp))
        shutil.rmtree(OUT / name, ignore_errors=True)
        shutil.copytree(tmp, OUT / name)
    print(f"recorded {name}: {sum(p.stat().st_size for p in (OUT / name).rglob('*') if p.is_file()) // 1024} KiB")


def refind(name: str) -> None:
    """A traced profile fixture's findings made again from its recorded trace, where the analysis (or how the
    block is written) changed: the JSON's findings block, the slices drawn in its trace.json and the findings
    after the tables of its stdout.txt, where a profile prints them (a fixture recorded when they came first has
    them moved); the measurements stay as the job wrote them."""
    import io
    import json

    from rich.console import Console

    from commprof.findings.kinds import of_trace
    from commprof.findings.untraced import with_figures
    from commprof.report.findings_block import findings_text

    folder = OUT / name
    doc = json.loads((folder / "profile.json").read_text())
    doc["findings"] = with_figures(of_trace(str(folder / "trace")), doc)
    (folder / "profile.json").write_text(json.dumps(doc, indent=1) + "\n")
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None, force_terminal=False).print(findings_text(doc["findings"]),
                                                                              highlight=False)
    printed = (folder / "stdout.txt").read_text()
    tables = printed[printed.index("commprof profile · "):]
    if "\nfindings" in tables:  # the block after the tables, as a profile prints it: made again
        tables = tables[:tables.index("\nfindings") + 1]
    (folder / "stdout.txt").write_text(tables + buf.getvalue())
    print(f"found again {name}")


def _relative(folder: Path) -> None:
    """The JSON names its trace folder by the temporary path it was written to: the fixture's own name instead,
    relative to the JSON, so a test reads it wherever the checkout lies."""
    for path in folder.glob("*.json"):
        text = path.read_text().replace(str(folder) + "/", "").replace(str(folder), ".")
        path.write_text(text)


def readme() -> None:
    lines = ["# tests/recorded/", "",
             "Fixtures of the fast lane (tests/unit/): what real commprof jobs wrote on a 2-core VM (gloo, torch "
             "2.14.1, CPU), read back without starting a process. Made, all or one, by "
             "`python tests/support/record.py [NAME]`; each folder holds the job's JSON, its trace where traced, "
             "and what it printed (stdout.txt, 120 columns). Paths inside the JSON are relative to its folder.", "",
             "| fixture | what it is for | command |", "| --- | --- | --- |"]
    for name, (args, why) in FIXTURES.items():
        shown = " ".join(a.replace(str(TESTS.parent) + "/", "") for a in args).replace("{out}", name)
        lines.append(f"| {name} | {why} | `commprof {shown}` |")
    (OUT / "README.md").write_text("\n".join(lines) + "\n")


REFOUND = ("slowed", "balanced", "per-param")
"""The traced profile fixtures whose findings `--findings` makes again."""

if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    if sys.argv[1:2] == ["--findings"]:
        for name in sys.argv[2:] or REFOUND:
            refind(name)
        sys.exit(0)
    for name in sys.argv[1:] or FIXTURES:
        if name not in FIXTURES:
            sys.exit(f"record: no fixture {name!r}; one of {', '.join(FIXTURES)}")
        record(name)
    readme()
