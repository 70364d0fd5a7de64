"""Any argv of `commprof bench` and `commprof run` is either accepted or ends, before any rank starts, with
exit 2 and one `commprof: error:` line: never a traceback, never another code.

Hypothesis draws the argv from tests/cli_fuzz.py's grammar and runs each through the parser and
cli.call into lifecycle.configure() with the command, the code main runs before it launches; no process starts.
The grammar draws every flag the parser has, every flag also gets every boundary value of its kind, and the
inputs the fuzzing found mishandled are kept as cases (tests/test_fuzz_cli.py launches three rejected argv
for real).
"""

import math

import pytest
from cli_fuzz import BENCH_ARGV, FLAGS, RUN_ARGV, SLOW_IS_FINE, boundary_argv, check, problem
from hypothesis import given, settings

from commprof.base.flags import INT64_MAX, MAX_TIMEOUT_S
from commprof.base.units import MAX_SIZE
from commprof.cli.commands import build_parser

# derandomize: the same examples on every run, so that the suite never fails by chance.
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=SLOW_IS_FINE)


def wrong_with(argv: list[str]) -> str | None:
    """What is wrong with how `commprof <argv>` ends before any rank starts, or None; an accepted config
    must also hold only values its ranks can use."""
    outcome = check(argv)
    found = problem(outcome.code, outcome.stderr)
    if found or outcome.code or outcome.config is None:  # None: run --list-models, which prints and returns
        return found
    cfg = outcome.config
    checks = {"at least 1 rank": 1 <= outcome.nproc <= INT64_MAX,
              "a usable --timeout": 0 < cfg.timeout_s <= MAX_TIMEOUT_S}
    if argv[0] == "bench":
        sizes = cfg.sizes()
        checks.update({
            "-n, -w, --root in range": cfg.iters >= 1 and cfg.warmup >= 0 and cfg.root >= 0,
            "a finite -f": math.isfinite(cfg.step_factor),
            "sizes from -b to at most -e": sizes[0] == cfg.min_bytes and sizes[-1] <= cfg.max_bytes,
            "nothing measured twice": all(len(set(v)) == len(v) for v in (cfg.collectives, cfg.algos, cfg.dtypes,
                                                                          cfg.ops)),
        })
    else:
        checks.update({
            "finite floats": all(math.isfinite(v) for v in (cfg.lr, cfg.bucket_mb, cfg.loss_threshold or 0.0)),
            "a usable --lr and --bucket-mb": cfg.lr >= 0 and 0 < cfg.bucket_mb * 2 ** 20 <= MAX_SIZE,
            "a 64-bit --seed": -(1 << 63) <= cfg.seed < 1 << 64,
            "positive sizes": all(v is None or v >= 1 for v in (cfg.num_classes, cfg.image_size, cfg.in_channels)),
        })
    failed = [name for name, ok in checks.items() if not ok]
    return f"accepted without {', '.join(failed)}: {cfg}" if failed else None


def test_grammar_draws_every_flag():
    commands = build_parser()._subparsers._group_actions[0].choices
    for name, flags in FLAGS.items():
        registered = {o for action in commands[name]._actions for o in action.option_strings} - {"-h", "--help"}
        assert {o for flag in flags for o in flag.options} == registered, name


@FUZZ
@given(BENCH_ARGV)
def test_bench_argv_is_accepted_or_one_line_exit_2(argv):
    assert wrong_with(argv) is None, argv


@FUZZ
@given(RUN_ARGV)
def test_run_argv_is_accepted_or_one_line_exit_2(argv):
    assert wrong_with(argv) is None, argv


def test_every_flag_with_every_boundary_value():
    wrong = {" ".join(map(repr, argv)): found for argv in boundary_argv() if (found := wrong_with(argv))}
    assert not wrong, "\n".join(f"{argv}: {found}" for argv, found in list(wrong.items())[:20])


# What the fuzzing found: each argv crashed, was taken silently, or failed later inside a rank.
REJECTED = [
    (["bench", "-f", "nan"], "-f nan must be a finite number"),
    (["bench", "-f", "inf", "-i", "8"], "-f inf must be a finite number"),
    (["bench", "-b", "1", "-e", "64", "-f", "1.5"], "-f 1.5 does not grow size 1"),
    (["bench", "-b", "0", "-e", "64"], "-f 2 does not grow size 0"),
    (["bench", "-b", "1", "-e", "1T", "-i", "1"], "-i 1 makes more than 10000 sizes"),
    (["bench", "-e", "9" * 400], "is over 9223372036854775807 bytes"),
    (["bench", "-e", "8\u212a"], "cannot read size '8\u212a'"),
    (["bench", "-e", "\u0663"], "cannot read size '\u0663'"),
    (["bench", "--nproc", "0"], "--nproc 0 must be at least 1"),
    (["bench", "--nproc", "-3", "-r", "0"], "--nproc -3 must be at least 1"),
    (["bench", "-r", "-1"], "--root -1 must be at least 0"),
    (["bench", "-n", str(1 << 63)], f"-n {1 << 63} is over {INT64_MAX}"),
    (["bench", "--timeout", "nan"], "--timeout nan must be a finite number"),
    (["bench", "--timeout=-inf"], "--timeout -inf must be a finite number"),
    (["bench", "--timeout", "1e10"], "--timeout 1e+10 must be positive and at most 1e+09 s"),
    (["bench", "--nproc=--"], "argument --nproc: expected one argument"),
    (["bench", "-d--"], "argument -d/--datatype: expected one argument"),
    (["bench", "--bogus\nx"], "unrecognized arguments: --bogus\\nx"),
    (["run", "--model=--"], "argument --model: expected one argument"),
    (["run", "--nproc", "0"], "--nproc 0 must be at least 1"),
    (["run", "--nproc", "-1", "--strategy", "single"], "--nproc -1 must be at least 1"),
    (["run", "--lr", "nan"], "--lr nan must be a finite number"),
    (["run", "--lr", "-0.1"], "--lr -0.1 must not be negative"),
    (["run", "--bucket-mb", "inf"], "--bucket-mb inf must be a finite number"),
    (["run", "--bucket-mb", "nan"], "--bucket-mb nan must be a finite number"),
    (["run", "--bucket-mb", "1e308"], "--bucket-mb 1e+308 is over 8796093022207 MiB"),
    (["run", "--loss-threshold", "nan"], "--loss-threshold nan must be a finite number"),
    (["run", "--timeout", "inf"], "--timeout inf must be a finite number"),
    (["run", "--seed", str(1 << 64)], f"--seed {1 << 64} does not fit in 64 bits"),
    (["run", "--batch-size", str(1 << 63)], f"--batch-size {1 << 63} is over {INT64_MAX}"),
    (["run", "--num-classes", "0"], "--num-classes 0 must be at least 1"),
    (["run", "--image-size", "-4"], "--image-size -4 must be at least 1"),
    (["run", "--channels", "0"], "--channels 0 must be at least 1"),
    (["run", "x\u2028y"], "unrecognized arguments: x\\u2028y"),
    (["run", "--t=a\nb"], "ambiguous option: --t=a\\nb could match"),
]


@pytest.mark.parametrize("argv,words", REJECTED)
def test_found_inputs_are_one_line_exit_2(argv, words):
    outcome = check(argv)
    assert problem(outcome.code, outcome.stderr) is None and outcome.code == 2, outcome
    assert words in outcome.stderr, outcome.stderr


def test_found_inputs_that_are_fine():
    # A factor whose next size overflows a float ends the sweep; it used to raise OverflowError.
    assert check(["bench", "-b", "1K", "-e", "4K", "-f", "1e308"]).config.sizes() == [1024]
    # Repeated dtypes and ops are measured once, as repeated collectives and algorithms already were.
    cfg = check(["bench", "-d", "float,float32,fp32", "-o", "sum,sum,max"]).config
    assert (cfg.dtypes, cfg.ops) == (("float32",), ("sum", "max"))
