"""One rank's training run: build model, data and strategy, train, and return every figure as plain data.

Each step: the global batch's indices (the same on every rank count), this rank's contiguous shard,
split into micro-batches; `strategy.train_step` inside a phase-recorded iteration; the iteration's
compute/comm split and its op log's volume; the last step also measures what the rank's memory holds.
Exercised by: `pytest tests/test_run_cli.py` and `pytest tests/test_strategies.py` (its worker calls train).
"""

from __future__ import annotations

import resource

import torch
from torch.utils.checkpoint import checkpoint

from commprof.base.errors import UsageError
from commprof.data import global_indices, open_source, steps_per_epoch
from commprof.models import build_model, count_parameters
from commprof.record.annotate import ANNOTATOR, MEASURED
from commprof.record.clock import CpuClock, CudaClock
from commprof.record.phases import Phases
from commprof.record.recorder import OpRecorder
from commprof.record.volume import step_volume
from commprof.report.progress import StepProgress
from commprof.run import kineto
from commprof.run.config import RunConfig
from commprof.strategies import CATALOG

MS = 1e-6


def build(cfg: RunConfig):
    """(source, spec): the data source and the model, sized to each other."""
    from commprof.models import MODELS

    entry = MODELS[cfg.model]
    kind = entry.kind
    task = "classify" if kind == "image" else ("mlm" if entry.masked_lm else "lm")
    synthetic = cfg.data == "synthetic"  # a real data set has its own image size and channels
    source = open_source(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, task=task, seq_len=cfg.seq_len,
                         image_size=cfg.image_size or (entry.image_size if synthetic else None),
                         in_channels=cfg.in_channels or (entry.in_channels if synthetic else None),
                         num_classes=cfg.num_classes, num_samples=cfg.samples)
    if source.kind != kind:
        raise UsageError(f"model {cfg.model} takes {kind} input but --data {cfg.data} is {source.kind}")
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank and every world size
    if kind == "image":
        spec = build_model(cfg.model, num_classes=cfg.num_classes or source.num_classes,
                           in_channels=source.in_channels, image_size=source.image_size,
                           frozen_backbone=cfg.frozen_backbone, head_width=cfg.head_width)
    else:
        spec = build_model(cfg.model, vocab_size=source.num_classes, seq_len=source.seq_len)
    if cfg.checkpoint:
        for unit in spec.units:
            unit.forward = _checkpointed(unit.forward)
    return source, spec


def _checkpointed(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def train(cfg: RunConfig, comm, device: torch.device, on_step=None, start_live=None) -> tuple[dict, dict | None]:
    """Train on this rank; returns (figures, state): per-iteration figures, losses, volume, memory and
    accuracy as plain data, and the whole model's state_dict if --save-state asks for it (else None).
    `on_step(iterations)` sees the measured iterations so far after each one (to save them early);
    `start_live(clock, progress)` (--live) gives the live/monitor.py Live that folds each one with its ops and
    waits, started once the loop's clock and progress line exist."""
    source, spec = build(cfg)
    spec.module.to(device)
    # counted before a tensor-parallel strategy replaces layers by this rank's slices
    parameters = count_parameters(spec.module, trainable_only=False)
    trainable_parameters = count_parameters(spec.module, trainable_only=True)
    strategy = CATALOG[cfg.strategy].load()(spec=spec, comm=comm, config=cfg)
    rank, k = strategy.data_rank, strategy.data_ranks  # model-parallel ranks share a shard
    clock = CudaClock() if device.type == "cuda" else CpuClock()
    recorder = comm.recorder if comm is not None else OpRecorder(clock)
    phases = Phases(recorder, recorder.clock)
    global_batch = cfg.batch_size * k
    spe = steps_per_epoch(source.num_samples, global_batch)
    total = cfg.steps if cfg.steps is not None else cfg.epochs * spe
    if total <= cfg.warmup:
        raise UsageError(f"--epochs {cfg.epochs} is {total} step(s) of {source.name}: no measured step after "
                         f"--warmup {cfg.warmup}")
    micro = cfg.batch_size // strategy.micro_batches()
    iterations, losses, volumes = [], [], []
    spec.module.train()
    measured = ANNOTATOR.label(MEASURED, "iteration")
    progress = StepProgress("iteration", total, show=comm is None or comm.rank == 0)
    injector = comm.fault if comm is not None else None  # every group's (record/aligned.py wraps it a while)
    live = start_live(clock, progress) if start_live is not None else None
    with kineto.profiler(cfg.torch_profiler, comm, device, steps=total, warmup=cfg.warmup) as prof, progress:
        for t in range(total):
            if t == cfg.warmup:
                ANNOTATOR.push(measured)
            epoch, step = divmod(t, spe)
            phases.begin(t, aligned=0 < t < cfg.warmup)  # record/aligned.py
            if injector is not None:  # COMMPROF_FAULT's from_step: this step on
                injector.step = t
            with phases.phase("data"):
                idx = global_indices(source.num_samples, seed=cfg.seed, epoch=epoch, step=step,
                                     global_batch=global_batch)
                batch = source.get(idx[rank * cfg.batch_size:(rank + 1) * cfg.batch_size])
                if device.type == "cuda":  # from pinned memory, as a DataLoader with pin_memory: no host wait
                    x, y = (t.pin_memory().to(device, non_blocking=True) for t in (batch.x, batch.y))
                else:
                    x, y = batch.x, batch.y
                micro_batches = [(x[i:i + micro], y[i:i + micro]) for i in range(0, cfg.batch_size, micro)]
            step_result = strategy.train_step(micro_batches, phases, measure_memory=t == total - 1)
            split = phases.end()
            losses.append(step_result.loss)
            if t >= cfg.warmup:
                iterations.append({"step": t, **split.figures()})
                volumes.append(step_volume(phases.ops()))
                if live is not None:
                    live.add(iterations[-1], phases.ops(), phases.waits())
                if on_step is not None:
                    on_step(iterations)
            recorder.clear()
            kineto.step(prof)
            progress.advance(split.wall_ns * MS)
    ANNOTATOR.pop()  # measured
    losses = [float(loss) for loss in losses]  # the device's losses read now, after the last step
    result = {
        "rank": comm.rank if comm is not None else 0, "data_rank": rank, "reports_loss": strategy.reports_loss,
        "group_sizes": strategy.group_sizes(), "coords": strategy.coords(), "pipeline": strategy.pipeline_figures(),
        "iterations": iterations, "losses": losses, "volume_steps": volumes,
        "predicted": strategy.predicted_volume(), "held_bytes": step_result.held_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "gpu_max_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "parameters": parameters, "trainable_parameters": trainable_parameters,
        "steps_per_epoch": spe, "total_steps": total, "global_batch": global_batch,
        "tokens_per_sample": source.seq_len if source.kind == "text" else 0,
        "skipped_steps": strategy.scaler.skipped,
    }
    result["eval"] = evaluate(cfg, strategy, source, rank, k, device)
    return result, strategy.full_state() if cfg.save_state else None


def evaluate(cfg: RunConfig, strategy, source, rank: int, k: int, device) -> dict | None:
    """Accuracy on this rank's equal part of the held-out split (top-1; next-token for text)."""
    held = source.heldout
    if held is None or cfg.eval_samples <= 0:
        return None
    n = min(cfg.eval_samples, held.num_samples) // k * k
    if n == 0:
        return None
    part = torch.arange(rank * (n // k), (rank + 1) * (n // k))
    model = strategy.model
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for i in range(0, len(part), cfg.batch_size):
            batch = held.get(part[i:i + cfg.batch_size])
            out = strategy.infer(batch.x.to(device))
            if out is None:  # a model-parallel rank without the output (or not the one that counts it)
                continue
            y = batch.y.to(device)
            keep = y != -100
            correct += int(((out.argmax(-1) == y) & keep).sum())
            total += int(keep.sum())
    model.train()
    return {"correct": correct, "total": total} if total else None
