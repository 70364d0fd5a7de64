"""The command-line grammar `commprof bench` and `commprof run` argv are drawn from, and the in-process
check of one argv: what `commprof <argv>` exits with and prints before any rank starts.

    from cli_fuzz import BENCH_ARGV, RUN_ARGV, check, problem
    outcome = check(["bench", "-f", "nan"])   # Outcome(code=2, stderr="commprof: error: -f nan must be …\\n", …)
    problem(outcome.code, outcome.stderr)      # None: accepted, or one `commprof: error:` line and exit 2

Every flag of both subparsers is drawn (FLAGS; tests/unit/test_cli_grammar.py checks it against the parser) with
valid, boundary and invalid values, in every spelling argparse takes, repeated, missing its value, or
beside flags it conflicts with or that belong to the other command. Used by tests/unit/test_cli_grammar.py
and tests/support/fuzz_launch.py. Exercised by: `pytest tests/unit/test_cli_grammar.py tests/test_fuzz_cli.py`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from commprof import kernels
from commprof.base.backends import DEVICES
from commprof.base.errors import CommprofError, UnsupportedError, UsageError
from commprof.bench import command as bench
from commprof.bench.collectives import COLLECTIVES
from commprof.cli import commands, sweep
from commprof.cli import main as cli
from commprof.comm import BACKENDS
from commprof.comm.dtypes import ALIASES, DTYPES, REDUCE_OPS
from commprof.launcher import lifecycle
from commprof.models import MODELS
from commprof.parallel.partition import BALANCE
from commprof.run import command as run
from commprof.strategies import STRATEGIES

# What can be an element of a real process's argv: no NUL, no lone surrogate.
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=10)
ODD = ["", " ", "-", "--", "=", ",", ",,", "nope", "a\nb", "x\ry", "\u2028", "\x1e", "8\u212a", "\u0663", "%s",
       "{}", "'", "\\", "\U0001f4a5", "None", "True"]
GARBAGE = st.sampled_from(ODD) | TEXT


@dataclass(frozen=True)
class Values:
    """What a flag may be given: values it takes, and wrong ones, boundary values more often than garbage."""

    valid: st.SearchStrategy[str]
    edges: tuple[str, ...]
    """Boundary values (0, negative, huge, nan, unknown names, …): every one is tried on every flag that
    takes them (test_every_flag_with_every_boundary_value), and drawn often."""
    more: st.SearchStrategy[str] = st.nothing()
    """Further wrong or boundary values, drawn at random."""
    bad: st.SearchStrategy[str] = GARBAGE

    @property
    def wrong(self) -> st.SearchStrategy[str]:
        edge = st.sampled_from(self.edges) | self.more
        return st.one_of(edge, edge, edge, self.bad)


INTS = Values(st.integers(1, 6).map(str),
              ("0", "-1", "-7", "+3", " 2", "1_0", "\u0663", "9" * 30, str(1 << 63), str(1 << 64),
               str(-(1 << 63) - 1), "2.5", "1e3", "0x10", "9" * 5000),
              st.integers().map(str))
FLOATS = Values(st.sampled_from(["0.5", "1", "2", "4", "10", "30", "0.01"]) | st.floats(0.001, 1000).map(repr),
                ("0", "-0.0", "-1", "1.5", "1.0000001", "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e308",
                 "1e309", "-1e309", "5e-324", "1e9", "1e10", "9" * 400, "1_0", "0x10", "1,5"),
                st.floats().map(repr))
UNITS = ["", "K", "M", "G", "T", "B", "KiB", "kb", "m", "Q", "E"]
SIZES = Values(st.sampled_from(["8", "64", "1K", "4K", "16M", "1.5M", "64KiB", " 8 "])
               | st.builds("{}{}".format, st.integers(1, 4096), st.sampled_from(["", "K", "M"])),
               ("0", "1", "1T", "0.3", "00", "9" * 25, "9" * 5000, str((1 << 63) - 1), str(1 << 63), "12Q", "-8",
                "1e3", "8E", "8\u212a", "\u0663", "K", "1.5.5"),
               st.builds("{}{}".format, st.integers(0, 1 << 64) | st.sampled_from(["0.5", "1.5", "2.0"]),
                         st.sampled_from(UNITS)))
PATHS = Values(st.sampled_from(["out.json", "out.csv", "sub/dir/out"]), ("", ".", "/", "/nonexistent/deep/x.json", " "))
GROUPS = Values(st.sampled_from(["1", "2", "1,2", "2,1", "2,2"]),
                ("", "0", "-1", ",", "1,", "2,,1", "x", "1_0", " 2", "\u0663", "9" * 30, "9" * 5000, "1.5", "3"))
RATES = Values(st.sampled_from(["25", "25GB/s", "200Gbit/s", "0.5"]),
               ("", "0", "-1", "1Gb/s", "1Gbps", "nan", "inf", "9" * 400, "25 GB", "1e3"))
CUTS = Values(st.sampled_from(["1", "2", "2,5", "1,2,3"]),
              ("", "0", "-1,3", "5,2", "2,2", "1_0", " 3", "9" * 30, "a", "2,,5", "2;5", "1.5"))


def names(valid, unknown=("nope", "")) -> Values:
    return Values(st.sampled_from(list(valid)), tuple(unknown))


def comma_list(valid, *, everything: str = "all") -> Values:
    """'a', 'a,b,a' or 'all'; wrong: an unknown name or an empty item among known ones."""
    first = list(valid)[0]
    known = st.lists(st.sampled_from(list(valid)), min_size=1, max_size=4).map(",".join)
    item = st.sampled_from(list(valid)) | st.sampled_from(["", " ", "nope", everything.upper(), everything])
    return Values(known | st.just(everything),
                  ("", ",", f"{first},{first}", f"{first},", f",{first}", f"{first},nope", f"{everything},{first}",
                   everything.upper(), f" {first} "),
                  st.lists(item, min_size=2, max_size=4).map(",".join))


@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]
    """Every spelling the parser registers (--stages and --pp are one flag)."""
    values: Values | None
    """None for a flag that takes no value."""


BENCH = (
    Flag(("--backend",), names(BACKENDS, ("tcp", "NCCL", ""))),
    Flag(("--device",), names(DEVICES, ("gpu", "CUDA", ""))),
    Flag(("--algo",), comma_list([kernels.LIBRARY, *kernels.names()])),
    Flag(("--nproc",), INTS),
    Flag(("--group-sizes",), GROUPS),
    Flag(("--concurrent",), None),
    Flag(("--groups",), names(["intra", "inter", "intra,inter", "inter,intra"], ("rack", "", ",", "intra,rack"))),
    Flag(("-b", "--minbytes"), SIZES),
    Flag(("-e", "--maxbytes"), SIZES),
    Flag(("-f", "--stepfactor"), FLOATS),
    Flag(("-i", "--stepbytes"), SIZES),
    Flag(("-n", "--iters"), INTS),
    Flag(("-w", "--warmup_iters"), INTS),
    Flag(("-c", "--check"), names(["0", "1", "2", "5"], ("-1", "yes", "1.5"))),
    Flag(("-m", "--agg_iters"), INTS),
    Flag(("-z", "--blocking"), names(["0", "1"], ("2", "-1", "yes"))),
    Flag(("-o", "--op"), comma_list(REDUCE_OPS)),
    Flag(("-d", "--datatype"), comma_list([*DTYPES, *ALIASES])),
    Flag(("-a", "--average"), names(["avg", "min", "max", "rank0", "0", "1", "2", "3"], ("mean", "AVG", "4", "-1"))),
    Flag(("-r", "--root"), Values(INTS.valid | st.just("all"), (*INTS.edges, "ALL", "all,0", ""), INTS.more)),
    Flag(("--timeout", "-T"), FLOATS),
    Flag(("--json", "-J", "--output_file"), PATHS),
    Flag(("--trace",), PATHS),
    Flag(("--csv", "-F"), PATHS),
    Flag(("--format",), names(["table", "nccl-tests"], ("nccl", "NCCL-TESTS", "rich", ""))),
    # nccl-tests' flags that mean nothing here: refused with one line whatever their value
    *(Flag(options, names(["1", "2"], ("0", ""))) for options in (
        ("-t", "--nthreads"), ("-g", "--ngpus"), ("-p", "--parallel_init"), ("-G", "--cudagraph"),
        ("-N", "--run_cycles"), ("-C", "--report_cputime"), ("-R", "--local_register"),
        ("-S", "--report_timestamps"), ("-M", "--memory_report"), ("-y", "--stream_null"), ("-x", "--cta_policy"),
        ("-D", "--device_implementation"), ("-V", "--device_cta_count"))),
    Flag(("--plot",), PATHS),
    Flag(("--link-rate",), RATES),
    Flag(("--debug-dump",), PATHS),
    Flag(("--huge-pages",), None),
    Flag(("--bind-cores",), None),
    Flag(("--oversubscribe",), None),
)
RUN = (
    Flag(("--strategy",), names(STRATEGIES)),
    Flag(("--model",), names(MODELS, ("nope", "resnet", "GPT2"))),
    Flag(("--list-models",), None),
    Flag(("--backend",), names(BACKENDS, ("tcp", "NCCL", ""))),
    Flag(("--device",), names(DEVICES, ("gpu", "CUDA", ""))),
    Flag(("--nproc",), INTS),
    Flag(("--data",), names(run.DATA, ("imagenet", ""))),
    Flag(("--data-dir",), PATHS),
    Flag(("--batch-size",), INTS),
    Flag(("--steps",), INTS),
    Flag(("--epochs",), INTS),
    Flag(("--warmup",), INTS),
    Flag(("--seed",), INTS),
    Flag(("--lr",), FLOATS),
    Flag(("--optimizer",), names(["sgd", "adam"], ("lamb", "SGD"))),
    Flag(("--bucket-mb",), FLOATS),
    Flag(("--precision",), names(["fp32", "bf16", "fp16"], ("fp8", "float32"))),
    Flag(("--grad-accum",), INTS),
    Flag(("--checkpoint",), None),
    Flag(("--prefetch",), None),
    Flag(("--no-prefetch",), None),
    Flag(("--stages", "--pp"), INTS),
    Flag(("--tp",), INTS),
    Flag(("--dp",), INTS),
    Flag(("--micro-batches",), INTS),
    Flag(("--balance",), names(BALANCE, ("even",))),
    Flag(("--cuts",), CUTS),
    Flag(("--frozen-backbone",), None),
    Flag(("--head-width",), INTS),
    Flag(("--num-classes",), INTS),
    Flag(("--image-size",), INTS),
    Flag(("--channels",), INTS),
    Flag(("--seq-len",), INTS),
    Flag(("--samples",), INTS),
    Flag(("--loss-threshold",), FLOATS),
    Flag(("--eval-samples",), INTS),
    Flag(("--timeout",), FLOATS),
    Flag(("--save-state",), PATHS),
    Flag(("--json",), PATHS),
    Flag(("--csv",), PATHS),
    Flag(("--plot",), PATHS),
    Flag(("--debug-dump",), PATHS),
    Flag(("--huge-pages",), None),
    Flag(("--bind-cores",), None),
    Flag(("--oversubscribe",), None),
    Flag(("--trace",), PATHS),
    Flag(("--torch-profiler",), PATHS),
    Flag(("--link-rate",), RATES),
    Flag(("--live",), None),
    Flag(("--live-window",), INTS),
    Flag(("--metrics-port",), names(["0", "9464", "127.0.0.1:9464", "[::1]:0", "off"],
                                    ("http", "70000", "", ":", "a:b"))),
    Flag(("--live-log",), PATHS),
    Flag(("--metrics-targets",), PATHS),
    Flag(("--live-linger",), FLOATS),
)
FLAGS = {"bench": BENCH, "run": RUN}

SLOW_IS_FINE = [HealthCheck.too_slow]
"""The health check that times the machine, not the code: on a loaded one it would fail at random."""


@st.composite
def _spelled(draw, flag: Flag, *, wrong: bool) -> list[str]:
    """One flag as argv words: `--x v`, `--x=v` or `-xv`; wrong: also an abbreviation argparse may find
    ambiguous, a value given to a flag that takes none, or a value missing."""
    option = draw(st.sampled_from(flag.options))
    long = option.startswith("--")
    if wrong and long and draw(st.booleans()):  # argparse takes a unique prefix; a shared one is an error
        option = option[:draw(st.integers(3, len(option)))]
    if flag.values is None:
        return [f"{option}={draw(GARBAGE)}"] if wrong and draw(st.booleans()) else [option]
    value = draw(flag.values.wrong if wrong else flag.values.valid)
    form = draw(st.sampled_from(["apart", "apart", "joined"] + ["missing"] * wrong))
    if form == "missing":
        return [option]
    if form == "joined":  # `--x=-1`: the way to give a value argparse would take for an option
        return [f"{option}={value}" if long else f"{option}{value}"]
    return [option, value]


def _argv(command: str, foreign: str) -> st.SearchStrategy[list[str]]:
    """Up to five flags with values they take, and up to two wrong words: a flag's boundary or garbage
    value, the other command's flag, an unknown flag, a stray word. In any order: a wrong value is only
    reached through an argv whose other words are right, and right values still conflict with each
    other (--steps with --epochs, --tp with ddp, -b above -e)."""
    own, other = FLAGS[command], FLAGS[foreign]
    right = st.sampled_from(own).flatmap(lambda f: _spelled(f, wrong=False))
    wrong = st.one_of(*[st.sampled_from(own).flatmap(lambda f: _spelled(f, wrong=True))] * 6,
                      st.sampled_from(other).flatmap(lambda f: _spelled(f, wrong=False)),
                      st.sampled_from([["--bogus"], ["--bogus=1"], ["-z"], ["-"], ["--"], ["--t", "1"]]),
                      GARBAGE.map(lambda w: [w]))
    if command == "bench":  # collectives are bench's positionals, anywhere among the flags
        right |= st.sampled_from(list(COLLECTIVES)).map(lambda w: [w])
        wrong |= st.sampled_from(["nope", "allreduce", "all", ""]).map(lambda w: [w])
    groups = st.tuples(st.lists(right, max_size=5), st.lists(wrong, max_size=2)).map(lambda g: g[0] + g[1])
    return groups.flatmap(st.permutations).map(lambda words: [command, *(w for ws in words for w in ws)])


BENCH_ARGV = _argv("bench", "run")
RUN_ARGV = _argv("run", "bench")
ARGV = BENCH_ARGV | RUN_ARGV


@dataclass
class Outcome:
    code: int
    """The exit code main would return or exit with; 0 when the command would go on to start its ranks."""
    stderr: str
    stdout: str
    config: object = None
    """The config main would start the ranks with (None unless accepted)."""
    nproc: int | None = None
    """How many local ranks main would start (None unless accepted)."""


def check(argv: list[str]) -> Outcome:
    """What `commprof <argv>` does before any rank starts, in this process, through cli's own paths:
    the parser (argparse errors exit through it) and cli.call (CommprofError to one line and a code)."""
    out, err, seen = io.StringIO(), io.StringIO(), {}
    with _as_cli_main(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if argv and argv[0] in sweep.GRID_FLAGS and sweep.wanted(argv[0], argv[1:]):
                # a grid, or --plot: cli hands it to sweep, whose plan is every check before a job starts
                code = cli.call(lambda a: _plan(a, seen), argv)
                return Outcome(code, err.getvalue(), out.getvalue(), seen.get("config"), seen.get("nproc"))
            args = _parser().parse_args(argv)
            args.argv = argv
            code = cli.call(lambda a: _configure(a, seen), args)
        except SystemExit as exc:
            code = exc.code
        except UsageError as exc:  # the parser's refusals, said as cli.main says them
            code = cli.usage_error(exc)
    return Outcome(code, err.getvalue(), out.getvalue(), seen.get("config"), seen.get("nproc"))


@functools.cache
def _parser():
    return commands.build_parser()  # parsing leaves a parser as it was; building one is most of a check's time


@contextlib.contextmanager
def _as_cli_main():
    """COMMPROF_DEBUG: cli.call re-raises an unexpected exception instead of os._exit(1), which would end
    this process. No rank variables: cli speaks as the launcher (or rank 0) does."""
    saved = {k: os.environ.pop(k, None) for k in ("COMMPROF_DEBUG", "RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")}
    os.environ["COMMPROF_DEBUG"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def _plan(argv: list[str], seen: dict) -> int:
    plan = sweep.plan(argv[0], argv[1:])
    if not plan.grid:  # one job with --plot: the config its job gets
        args = _parser().parse_args([argv[0], *plan.base])
        args.argv = [argv[0], *plan.base]
        return _configure(args, seen)
    return 0


def _configure(args, seen: dict) -> int:
    if args.command == "run" and args.list_models:  # run's main prints the models and returns first
        return 0
    try:
        seen["config"], seen["nproc"] = lifecycle.configure({"bench": bench, "run": run}[args.command].COMMAND, args)
    except CommprofError as exc:
        if isinstance(exc, (UsageError, UnsupportedError)):
            raise
        # cli.call would os._exit for these: make it a failure this process can report.
        raise RuntimeError(f"{type(exc).__name__} (exit {exc.exit_code}) before any rank: {exc}") from exc
    return 0


def problem(code: int, stderr: str) -> str | None:
    """What is wrong with an outcome, or None: 0 and silence, or exit 2 and one `commprof: error:` line."""
    lines = stderr.splitlines()
    if code == 0:
        return None if not stderr.strip() else f"exit 0 but stderr {stderr[-500:]!r}"
    if code != 2:
        return f"exit {code}, not 2: {stderr[-2000:]!r}"
    if "Traceback" in stderr:
        return f"a traceback: {stderr[-2000:]!r}"
    if len(lines) != 1 or not stderr.endswith("\n") or not lines[0].startswith("commprof: error: "):
        return f"not one `commprof: error:` line: {stderr[-2000:]!r}"
    return None


def invalid_argv(n: int, *, seed_value: int | None = None, strategy=ARGV) -> list[list[str]]:
    """`n` different argv from the grammar that check() rejects: the same ones every time without
    `seed_value`, others for each seed."""
    found: dict[str, list[str]] = {}

    @settings(max_examples=max(100, 40 * n), database=None, derandomize=seed_value is None, deadline=None,
              phases=[Phase.generate], suppress_health_check=SLOW_IS_FINE)
    @given(strategy)
    def draw(argv):
        if check(argv).code == 2:
            found.setdefault(repr(argv), argv)

    (draw if seed_value is None else seed(seed_value)(draw))()
    # Hypothesis draws neighbours of an example one after another: pick from the whole lot.
    pool = list(found.values())
    return random.Random(seed_value or 0).sample(pool, min(n, len(pool)))


TAG = "COMMPROF_FUZZ_TAG"
"""Environment variable every launched process carries: its descendants inherit it, so they can be found."""


def leftovers(tag: str) -> list[int]:
    """Processes still alive whose environment holds TAG=tag (this user's only: others' are unreadable)."""
    needle = f"{TAG}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone already, or not ours
            continue
    return pids


CONTEXTS = {
    "bench": ([], ["all_reduce", "-e", "64", "-i", "8", "--nproc", "2"]),
    "run": ([], ["--strategy", "pipeline-1f1b", "--model", "gpt2-tiny", "--nproc", "2"],
            ["--strategy", "tensor", "--dp", "1", "--steps", "5"]),
}
"""Flags besides the one under test, so that its value is also checked past the ones that only apply
to some strategies or sweeps."""


def boundary_argv():
    """Every flag with each of its boundary values, in each context, and with each ODD word alone."""
    for command, flags in FLAGS.items():
        for flag in flags:
            option = next(o for o in flag.options if o.startswith("--"))
            # --x=v: a value such as -inf would otherwise be taken for a flag.
            words = [f"{option}={v}" for v in flag.values.edges] if flag.values else [option, f"{option}=1"]
            for context in CONTEXTS[command]:
                for word in words:
                    yield [command, *context, word]
            for odd in ODD:
                yield [command, f"{option}={odd}"]
