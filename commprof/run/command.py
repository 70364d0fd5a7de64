"""`commprof run`: train with one strategy and report, per iteration and per rank, where the time goes and
how many bytes cross ranks.

    commprof run --strategy ddp --model resnet18 --nproc 2
    commprof run --strategy fsdp --model gpt2-tiny --data text --data-dir input.txt --steps 20 --json out.json
    commprof run --strategy ddp --nproc 2 --steps 10 --csv ddp.csv      # one row: a grid's columns, one run
    commprof run --strategy single --model mnist-cnn --batch-size 128 --save-state single.pt
    commprof run --list-models

Exercised by: `pytest tests/test_run_cli.py` and `pytest tests/unit/test_cli_grammar.py`.
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from commprof.base import backends, files, flags
from commprof.base.backends import default_backend, require_cuda
from commprof.base.errors import UsageError
from commprof.base.measurement import SOURCES as DATA
from commprof.base.units import MAX_SIZE
from commprof.base.world import World
from commprof.launcher import lifecycle
from commprof.launcher.kept import Kept
from commprof.launcher.lifecycle import Rank
from commprof.live.config import add_live_flags, live_config
from commprof.models import MODELS, list_models
from commprof.parallel.grid import degrees
from commprof.parallel.partition import BALANCE
from commprof.perfmodel.fabric import link_flag
from commprof.run.config import RunConfig
from commprof.strategies import CATALOG


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("run", help=summary, description="""\
Train a model with one data-parallel or model-parallel strategy and report, per iteration and per rank,
where the time goes (compute, communication, their overlap and the communication left exposed) and how
many bytes each rank moves per step and per epoch, next to the strategy's prediction. Comma lists in
--strategy, --nproc, --model, --batch-size, ... run every combination into one comparison table.

examples:
  commprof run --strategy ddp --model resnet18 --nproc 2
  commprof run --strategy fsdp --model gpt2-tiny --data text \\
      --data-dir input.txt --steps 20 --json out.json
  commprof run --strategy ddp --nproc 2 --steps 10 --csv ddp.csv
  commprof run --strategy single,ddp,fsdp --nproc 1,2 --json grid.json
  commprof run --list-models
""")
    p.add_argument("--strategy", default="ddp", help=f"{', '.join(CATALOG)} (default ddp)")
    p.add_argument("--model", default="mnist-cnn", help="see --list-models (default mnist-cnn)")
    p.add_argument("--list-models", action="store_true", help="list the models and exit")
    p.add_argument("--data", default="synthetic", help=f"{', '.join(DATA)} (default synthetic)")
    p.add_argument("--data-dir", help="directory of the real data files (the file itself for --data text)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--steps", type=int, help="optimizer steps, warm-up included (default 20 unless --epochs)")
    p.add_argument("--epochs", type=int, help="whole passes over the data instead of --steps")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps not measured (default 2, fewer than profile's 4 as run's default 20 steps are few: "
                        "its one aligned step cannot price a straggler's late ops; give 4 for that, "
                        "docs/findings.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--bucket-mb", type=float, help="ddp bucket MiB (default 25); mpi-dp fusion MiB (64)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing per model unit")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True,
                   help="fsdp: prefetch the next unit's parameters (default on)")
    p.add_argument("--stages", "--pp", type=int, dest="pp",
                   help="pipelines: stages, one rank each (default: ranks / --dp)")
    p.add_argument("--tp", type=int, help="tensor: tensor-parallel degree (default: ranks / --dp)")
    p.add_argument("--dp", type=int, help="model-parallel strategies: data-parallel replicas (default 1)")
    p.add_argument("--micro-batches", type=int, default=4, help="pipelines: micro-batches per step (default 4)")
    p.add_argument("--balance", choices=BALANCE, default="params",
                   help="pipelines: equalise parameters or measured time per stage (default params)")
    p.add_argument("--cuts", help="pipelines: first layer index of stages 1..p-1, e.g. 2,5 (overrides --balance)")
    p.add_argument("--frozen-backbone", action="store_true", help="frozen backbone + 4096-4096 head")
    p.add_argument("--head-width", type=int, help="--frozen-backbone: the head's hidden width (default 4096)")
    p.add_argument("--num-classes", type=int)
    p.add_argument("--image-size", type=int)
    p.add_argument("--channels", type=int, dest="in_channels")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per text sample (default 64)")
    p.add_argument("--samples", type=int, help="synthetic data set size")
    p.add_argument("--loss-threshold", type=float, help="report the first step at or below this loss")
    p.add_argument("--eval-samples", type=int, default=1000, help="held-out samples for accuracy (default 1000)")
    flags.add_job_flags(p, nproc="one per core or GPU; single: 1", json="every figure per rank per iteration")
    flags.add_device_flag(p)
    p.add_argument("--csv", metavar="PATH", help="the run's figures as one CSV row (a grid's columns)")
    flags.add_link_flag(p)
    add_live_flags(p)
    p.add_argument("--save-state", metavar="PATH", help="write the final full model state_dict (rank 0)")
    flags.add_plot_flag(p, launcher=True)
    p.add_argument("--torch-profiler", metavar="DIR",
                   help="also a PyTorch profiler (Kineto) trace per rank, with what Holistic Trace Analysis needs")
    p.set_defaults(func=main)


def build_config(args: argparse.Namespace) -> RunConfig:
    """Validate the flags; raise UsageError with one line naming the problem."""
    flags.refuse_plot(args)
    if args.strategy not in CATALOG:
        raise UsageError(f"unknown strategy {args.strategy!r}: choose from {', '.join(CATALOG)}")
    if args.model not in MODELS:
        raise UsageError(f"unknown model {args.model!r}: choose from {', '.join(MODELS)} (--list-models)")
    if args.data not in DATA:
        raise UsageError(f"unknown data {args.data!r}: choose from {', '.join(DATA)}")
    backend = args.backend or default_backend()
    if backend == "nccl":
        require_cuda()
    device = backends.device(backend, args.device)
    strategy = CATALOG[args.strategy]
    if backend not in strategy.backends:
        raise UsageError(f"strategy {args.strategy} runs on --backend {', '.join(strategy.backends)}")
    for flag, value, low in (("--batch-size", args.batch_size, 1), ("--warmup", args.warmup, 0),
                             ("--grad-accum", args.grad_accum, 1), ("--steps", args.steps, 1),
                             ("--epochs", args.epochs, 1), ("--eval-samples", args.eval_samples, 0),
                             ("--seq-len", args.seq_len, 2), ("--samples", args.samples, 1),
                             ("--num-classes", args.num_classes, 1), ("--image-size", args.image_size, 1),
                             ("--channels", args.in_channels, 1)):
        flags.at_least(flag, value, low)
    if not -(1 << 63) <= args.seed < 1 << 64:  # what torch.manual_seed takes
        raise UsageError(f"--seed {args.seed} does not fit in 64 bits")
    for flag, value in (("--lr", args.lr), ("--bucket-mb", args.bucket_mb), ("--loss-threshold", args.loss_threshold)):
        flags.finite(flag, value)
    if args.lr < 0:  # torch's optimizers refuse it, inside every rank
        raise UsageError(f"--lr {args.lr:g} must not be negative")
    if args.steps is not None and args.epochs is not None:
        raise UsageError("give --steps or --epochs, not both")
    if args.batch_size % args.grad_accum:
        raise UsageError(f"--batch-size {args.batch_size} is not divisible by --grad-accum {args.grad_accum}")
    if args.head_width is not None and not args.frozen_backbone:
        raise UsageError("--head-width sizes the --frozen-backbone head: give --frozen-backbone too")
    if args.head_width is not None and args.head_width < 1:
        raise UsageError(f"--head-width must be at least 1, got {args.head_width}")
    parallel = strategy.model_parallel
    for flag, value, applies in (("--stages", args.pp, parallel == "pp"), ("--tp", args.tp, parallel == "tp"),
                                 ("--dp", args.dp, parallel is not None), ("--cuts", args.cuts, parallel == "pp")):
        if value is not None and not applies:
            raise UsageError(f"{flag} does not apply to strategy {args.strategy}")
    for flag, value in (("--stages", args.pp), ("--tp", args.tp), ("--dp", args.dp),
                        ("--micro-batches", args.micro_batches)):
        flags.at_least(flag, value, 1)
    if parallel == "pp" and args.batch_size % args.micro_batches:
        raise UsageError(f"--batch-size {args.batch_size} is not divisible by --micro-batches {args.micro_batches}")
    cuts = _cuts(args.cuts)
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        raise UsageError(f"--bucket-mb {args.bucket_mb:g} must be positive")
    if args.bucket_mb is not None and args.bucket_mb * 2 ** 20 > MAX_SIZE:  # ddp takes int(MiB × 2**20)
        raise UsageError(f"--bucket-mb {args.bucket_mb:g} is over {MAX_SIZE >> 20} MiB")
    job = flags.job_config(args, backend)
    steps = args.steps if args.steps is not None or args.epochs is not None else 20
    if args.warmup >= (steps or 10 ** 9):
        raise UsageError(f"--warmup {args.warmup} leaves no measured step of --steps {steps}")
    if args.data != "synthetic" and not args.data_dir:
        raise UsageError(f"--data {args.data} reads local files: give --data-dir")
    return RunConfig(
        strategy=args.strategy, model=args.model, device=device, data=args.data,
        data_dir=args.data_dir,
        batch_size=args.batch_size, steps=steps, epochs=args.epochs, warmup=args.warmup, seed=args.seed,
        lr=args.lr, optimizer=args.optimizer, bucket_mb=args.bucket_mb or 25.0,
        bucket_mb_given=args.bucket_mb is not None, precision=args.precision, grad_accum=args.grad_accum,
        checkpoint=args.checkpoint, prefetch=args.prefetch, frozen_backbone=args.frozen_backbone,
        head_width=args.head_width or 4096,
        dp=args.dp, pp=args.pp, tp=args.tp, micro_batches=args.micro_batches, balance=args.balance, cuts=cuts,
        num_classes=args.num_classes, image_size=args.image_size, in_channels=args.in_channels,
        seq_len=args.seq_len, samples=args.samples, loss_threshold=args.loss_threshold,
        eval_samples=args.eval_samples, save_state=args.save_state, torch_profiler=args.torch_profiler,
        link=link_flag(args.link_rate), live=live_config(args), **job)


def _cuts(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--cuts {text!r} must be comma-separated layer indices, e.g. 2,5") from None


class _Run(lifecycle.Command):
    """run's part of the job's life cycle (commprof/launcher/lifecycle.py)."""

    build_config = staticmethod(build_config)
    findings = True

    @staticmethod
    def local_ranks(cfg: RunConfig, slots: int) -> int:
        """--nproc; else a model-parallel run sized by its degrees, single on 1, the rest on one rank
        per core or GPU (at least 2)."""
        if cfg.nproc is not None:
            return cfg.nproc
        inner = cfg.pp if cfg.pp is not None else cfg.tp
        if inner is not None:
            return inner * (cfg.dp or 1)
        return 1 if cfg.strategy == "single" else max(2, slots)

    @staticmethod
    def check_world(cfg: RunConfig, world_size: int) -> None:
        parallel = CATALOG[cfg.strategy].model_parallel
        if parallel is not None:
            _, inner = degrees(world_size, dp=cfg.dp, inner=cfg.pp if parallel == "pp" else cfg.tp,
                               flag="--stages" if parallel == "pp" else "--tp")
            if parallel == "pp" and inner < 2:  # known before any rank starts: a grid skips it up front
                raise UsageError(f"strategy {cfg.strategy} needs at least 2 stages (--stages), got {inner}")
        if cfg.strategy == "single" and world_size != 1:
            raise UsageError(f"strategy single runs on one process, not {world_size}")
        if cfg.strategy == "fsdp" and world_size < 2:
            raise UsageError("strategy fsdp shards over ranks and needs at least 2 (--nproc 2)")

    @staticmethod
    def without_comm(cfg: RunConfig, world: World) -> bool:
        return cfg.strategy == "single" and not world.launched

    @staticmethod
    def work(cfg: RunConfig, rank: Rank) -> dict:
        """Train; rank 0 keeps its iterations in the --json file as they come and saves the model."""
        on_step, kept = None, None
        if cfg.out.json and rank.world.rank == 0 and rank.comm is not None:
            held = {"0": []}  # rank 0's iterations, as the loop holds them

            def document(reason: str) -> dict:
                return {"complete": False, "reason": reason, "world_size": rank.world.world_size,
                        "note": "iterations of rank 0 only: the other ranks' figures are gathered at the end",
                        "iterations": dict(held)}

            kept = Kept(cfg.out.json, document)
            rank.on_failure(kept.abandon)

            def on_step(so_far: list[dict]) -> None:
                held["0"] = so_far
                kept.update()
        import torch  # the ranks' imports: the launcher checks the flags without loading torch

        from commprof.run.loop import train

        comm = rank.comm if cfg.strategy != "single" else None
        start_live, started = None, []
        if cfg.live is not None:
            from commprof.live import monitor

            def start_live(clock, progress) -> monitor.Live:  # as profile attaches its own (live/monitor.py)
                live = monitor.start(cfg.live, clock=clock, progress=progress, rank=rank.world.rank,
                                     world_size=rank.world.world_size,
                                     control=rank.comm.control if rank.comm is not None else None,
                                     contention=rank.contention, link=cfg.link, local_rank=rank.world.local_rank,
                                     local_world_size=rank.world.local_world_size, backend=cfg.backend)
                rank.on_failure(lambda code, message: live.close(message))
                started.append(live)
                return live
        result, state = train(cfg, comm, rank.device, on_step=on_step, start_live=start_live)
        if kept is not None:  # no snapshot after this: the report replaces the file
            kept.close()
        for live in started:
            live.close()
        if cfg.save_state and rank.world.rank == 0:
            tmp = f"{cfg.save_state}.tmp{os.getpid()}"
            torch.save(state, tmp)
            os.replace(tmp, cfg.save_state)
        return result

    @staticmethod
    def report(cfg: RunConfig, rank: Rank, results: list) -> int:
        from commprof.record.contention import note
        from commprof.report.fit import results_console
        from commprof.report.run_table import run_tables
        from commprof.run.results import combine

        if rank.contention is not None:
            rank.env["contention"] = rank.contention.read()
        doc = combine(cfg, results, rank.env)
        console = results_console()
        from commprof.findings.kinds import of_trace
        from commprof.findings.untraced import with_figures
        from commprof.report.findings_block import findings_text

        traced = of_trace(rank.trace_dir, link=cfg.link) if rank.trace_dir else None
        findings = with_figures(traced, doc)
        if findings is not None:
            doc["findings"] = findings
        for table in run_tables(doc):
            console.print(table)
        if findings is not None:  # after the tables, whose step it names
            console.print(findings_text(findings), highlight=False)
        said = note(rank.env.get("contention"))
        if said:
            console.print(said, highlight=False)
        if cfg.out.json:
            files.write_result(cfg.out.json, {"complete": True, **doc})
        if cfg.out.csv:
            from commprof.report.compare import RUN_COLUMNS, run_row

            row = run_row({"label": cfg.strategy, "config": {}, "result": doc})
            files.write_csv(cfg.out.csv, [{"strategy": cfg.strategy, "nproc": rank.world.world_size, **row}],
                            columns=("strategy", "nproc", *RUN_COLUMNS[1:]))
        return 0


COMMAND = _Run()


def main(args: argparse.Namespace) -> int:
    if args.list_models:
        from commprof.report.run_table import models_table
        Console().print(models_table(list_models()))
        return 0
    return lifecycle.main(COMMAND, args)
