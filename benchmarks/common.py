"""What the benchmarks share: their flags, starting ranks and jobs under a deadline, the environment
record, a rank's batches, arms interleaved round by round, a median with its 95 % confidence interval.

Not a benchmark itself: every benchmarks/*.py script imports it (Python puts the script's folder first on
sys.path), as do gpu_checks.py's steps in gpu_steps/ (`capture`: a command whose failure is theirs to record).
Exercised by `pytest tests/test_benchmarks.py`, which runs every script with --quick.

Flags. `parser()` gives every benchmark `--quick` and `--json PATH`; `parse()` reads them. A quick run takes
a few seconds (the smallest sizes, one or two rounds, few steps) and writes only the files named on its
command line, so its figures never replace the recorded ones in benchmarks/results/.

Ratios. `ratio_ci()` is the median over rounds of the per-round ratio, with the 95 % confidence interval of
that median from order statistics (`median_ci`: the sign test's ranks n/2 ± 1.96·√n/2, the normal
approximation of the binomial): it assumes nothing of the ratios' distribution and draws nothing at random.
Up to 7 rounds it is their whole range.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from commprof.base.stats import median_ci

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NPROC = 2
SKIP = 77
"""Exit status of a benchmark that cannot run on this machine (no C compiler, not root): the test skips it."""
TERM_GRACE_S = 5.0
"""How long a process told to stop (SIGTERM: launchers pass it to their ranks) has before SIGKILL."""


# ---- flags -------------------------------------------------------------------------------------------
def parser(doc: str, *, json: str | None = None, png: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every benchmark takes: --quick, --json PATH, and --png PATH where
    the benchmark draws a plot. `json` and `png` name the files under benchmarks/results/ that a full run
    writes when not told otherwise; without `json`, a run writes JSON only when given --json."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a few seconds at the smallest sizes, to see that it runs; writes only the files named")
    p.add_argument("--json", metavar="PATH", default=str(RESULTS / json) if json else None,
                   help=f"results file (default: {'benchmarks/results/' + json if json else 'none'}); '' for none")
    if png:
        p.add_argument("--png", metavar="PATH", default=str(RESULTS / png),
                       help=f"plot (default: benchmarks/results/{png}); '' for none")
    return p


def parse(p: argparse.ArgumentParser, quick: dict[str, Any]) -> argparse.Namespace:
    """The parsed flags. With --quick, `quick`'s values replace the defaults (flags given still win) and
    --json and --png default to none."""
    args = p.parse_args()
    if args.quick:
        unwritten = {k: None for k in ("json", "png") if hasattr(args, k)}
        args = p.parse_args(namespace=argparse.Namespace(**unwritten, **quick))
    return args


def training_parser(doc: str, *, model: str, batch: str, steps: int, rounds: int, warmup: int,
                    what: str) -> argparse.ArgumentParser:
    """parser() with the flags of the benchmarks that train a model on their own ranks (the hidden ones
    start a rank): `batch` says what --batch counts, `what` what --steps and --warmup count per round."""
    p = parser(doc)
    p.add_argument("--model", default=model, help=f"a commprof.models name (default {model})")
    p.add_argument("--batch", type=int, default=32, help=f"{batch} (default 32)")
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps per {what} per round (default {steps})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"interleaved rounds (default {rounds})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps per {what} first (default {warmup})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def training_argv(p: argparse.ArgumentParser, args: argparse.Namespace, *extra: str) -> list[str]:
    """The flags a rank of a training benchmark is started with: the parent's, checked and spelled out."""
    if min(args.batch, args.steps, args.rounds) < 1 or args.warmup < 0:
        p.error("--batch, --steps and --rounds must be at least 1, --warmup at least 0")
    return ["--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps),
            "--rounds", str(args.rounds), "--warmup", str(args.warmup), *extra]


def skip(what: str, reason: str) -> None:
    """Say in one line why this benchmark cannot run here, and exit SKIP."""
    print(f"{what}: {reason}", file=sys.stderr)
    sys.exit(SKIP)


# ---- processes under a deadline ----------------------------------------------------------------------
def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> subprocess.Popen | None:
    """Wait for every process; once one fails, or time runs out, stop the rest. The process that failed
    first, or None when all exited 0; TimeoutError when the deadline came first."""
    deadline = time.monotonic() + timeout_s
    while None in [p.poll() for p in procs]:  # a list: every process polled, none skipped
        failed = next((p for p in procs if p.returncode), None)
        if failed is not None or time.monotonic() > deadline:
            stop(procs)
            if failed is None:
                raise TimeoutError(f"no result within {timeout_s:.0f} s")
            return failed
        time.sleep(0.05)
    return next((p for p in procs if p.returncode), None)


def stop(procs: list[subprocess.Popen], *, group: bool = False) -> None:
    """SIGTERM every live process (a launcher passes it to its ranks), SIGKILL what is left after the grace.
    With `group`, each signal goes to the process's whole session (one started with start_new_session), so
    what it started goes too."""
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGTERM, group)
    deadline = time.monotonic() + TERM_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL, group)
            p.wait()


def _signal(p: subprocess.Popen, sig: int, group: bool) -> None:
    if not group:
        p.send_signal(sig)
        return
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:  # the session ended between the check and the signal
        pass


def run_all(commands: list[tuple[list[str], dict | None]], *, timeout_s: float, what: str,
            labels: list[str] | None = None, cwd: str | None = None) -> list[str]:
    """Run the commands side by side, each (argv, env), in `cwd` (default: here), and return each one's stdout.
    When one fails or the deadline passes, the others are stopped and this process exits with one line: `what`,
    the failed command's label (default: its program's name), its exit status and the gist of its stderr.
    Output goes to files, so no pipe can fill up and stall a rank."""
    with tempfile.TemporaryDirectory(prefix="commprof-bench-") as tmp:
        procs, late = [], None
        try:
            for i, (argv, env) in enumerate(commands):
                with open(Path(tmp) / f"{i}.out", "w") as out, open(Path(tmp) / f"{i}.err", "w") as err:
                    procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                                  cwd=cwd))
            failed = wait_all(procs, timeout_s)
        except TimeoutError as exc:
            failed, late = None, exc
        finally:
            stop(procs)
        outs = [(Path(tmp) / f"{i}.out").read_text(errors="replace") for i in range(len(procs))]
        if failed is not None:
            err = (Path(tmp) / f"{procs.index(failed)}.err").read_text(errors="replace")
    if late is not None:
        sys.exit(f"{what}: {late}")
    if failed is not None:
        label = labels[procs.index(failed)] if labels else Path(failed.args[0]).name
        sys.exit(f"{what}: {label} exited {failed.returncode}: {gist(err)}")
    return outs


def gist(stderr: str) -> str:
    """The line of a failed process's stderr that says what went wrong: the last error or exception line
    (a launcher's summary may follow it), else the last line with words in it."""
    lines = [line.strip() for line in stderr.splitlines() if re.search(r"\w", line)]
    errors = [line for line in lines if re.search(r"(Error|Exception)\b:|\berror: ", line)]
    return (errors or lines or ["(nothing on stderr)"])[-1]


RUNNING: list[subprocess.Popen] = []
"""The processes capture() is waiting on, for a signal handler to stop: stop(RUNNING, group=True)."""


def capture(argv: list[str], *, timeout_s: float, env: dict | None = None, cwd: str | Path | None = None) -> dict:
    """One command in a session of its own for at most timeout_s, output to files, whatever it exits with:
    {"rc": its exit status, None when stopped at the deadline (its session with it), "wall_s", "stdout",
    "stderr"}. Unlike job(), nothing exits here: the caller judges a failure (gpu_checks.py records it and goes
    on to its next check)."""
    with tempfile.TemporaryDirectory(prefix="commprof-bench-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        t0 = time.monotonic()
        with open(out, "w") as out_f, open(err, "w") as err_f:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out_f, stderr=err_f, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        RUNNING.append(proc)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            stop([proc], group=True)
            rc = None
        finally:
            RUNNING.remove(proc)
        wall = time.monotonic() - t0
        return {"rc": rc, "wall_s": round(wall, 2), "stdout": out.read_text(errors="replace"),
                "stderr": err.read_text(errors="replace")}


def job(argv: list[str], *, env: dict | None = None, timeout_s: float, what: str, cwd: str | None = None) -> str:
    """One command (a launcher, an mpiexec) under a deadline; its stdout. See run_all."""
    return run_all([(argv, env)], timeout_s=timeout_s, what=what, cwd=cwd)[0]


def ranks(argv: list[str], nproc: int = NPROC, *, env: dict | None = None, timeout_s: float,
          what: str) -> list[str]:
    """`argv` as `nproc` local ranks with torchrun's variables (env:// rendezvous on 127.0.0.1, one
    intra-op thread each); each rank's stdout. See run_all."""
    from commprof.base.backends import free_port

    base = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
    return run_all([(argv, {**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(nproc)],
                   timeout_s=timeout_s, what=what, labels=[f"rank {r}" for r in range(nproc)])


def spawn_ranks(script: str, argv: list[str], tmp: str, nproc: int = NPROC, timeout_s: float = 1800) -> Path:
    """Run `script --worker --out tmp/rows.json argv` as `nproc` gloo ranks; the path rank 0 wrote."""
    out = Path(tmp) / "rows.json"
    name = Path(script).name
    ranks([sys.executable, str(Path(script).resolve()), "--worker", "--out", str(out), *argv], nproc,
          timeout_s=timeout_s, what=name)
    if not out.exists():
        sys.exit(f"{name}: the ranks exited 0 but rank 0 wrote no results")
    return out


def with_root(env: dict | None = None, root: Path | str = ROOT) -> dict:
    """The environment with this checkout (or the one at `root`) first on PYTHONPATH, for processes that import
    commprof. Started from inside a checkout, `python -m commprof` imports that one's instead (python puts the
    folder it starts in first): a process of another checkout's starts from a folder outside both."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), env.get("PYTHONPATH"))))
    return env


# ---- what a result records ---------------------------------------------------------------------------
def env_record(argv: list[str], nproc: int = NPROC) -> dict:
    """Versions, cores, command and date, as `commprof run` reports them, for `nproc` gloo ranks on this host."""
    import torch

    from commprof.base.env import local_env, merge_env
    from commprof.base.world import usable_cores

    env = merge_env([local_env(torch.device("cpu"))], backend="gloo", world_size=nproc, local_world_size=nproc,
                    slots=usable_cores(), oversubscribed=nproc > usable_cores(), launcher="benchmark", clock="cpu",
                    argv=argv)
    env.update(cores=usable_cores(), omp_num_threads_per_rank=1)
    return env


def image_model(name: str):
    """A 10-class model of 3×32×32 images: torchvision's ResNet-18 ("resnet18"), or "small", --quick's: two
    convolutions with BatchNorm, as ResNet has, and no torchvision to import."""
    import torch

    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    if name != "small":
        raise ValueError(f"model {name!r}: resnet18 or small")
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2),
                         nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def make_batches(source, *, rank: int, world_size: int, batch: int, steps: int, seed: int = 0) -> list:
    """This rank's (x, y) for steps 0 … steps-1, sliced from the global batch as commprof.run.loop does."""
    from commprof.data import global_indices, steps_per_epoch

    spe = steps_per_epoch(source.num_samples, batch * world_size)
    out = []
    for t in range(steps):
        epoch, step = divmod(t, spe)
        idx = global_indices(source.num_samples, seed=seed, epoch=epoch, step=step, global_batch=batch * world_size)
        b = source.get(idx[rank * batch:(rank + 1) * batch])
        out.append((b.x, b.y))
    return out


# ---- commprof's trainers against PyTorch's (run_vs_torch.py, pipeline_vs_torch.py) -------------------
def timed_rounds(comm, trainers: dict, names, done: dict, *, rounds: int, steps: int) -> list[dict]:
    """`rounds` rounds of `steps` timed steps per trainer (name -> (step, …)), each after a barrier, the
    order of `names` reversing every round; per round and trainer the median ms per step, and which side
    went first ("ours" or "torch"). `done` counts the steps each trainer has run."""
    now = time.perf_counter_ns

    def timed(name: str) -> Callable[[], float]:
        def run() -> float:
            step, times = trainers[name][0], []
            for _ in range(steps):
                t0 = now()
                step(done[name])
                times.append(now() - t0)
                done[name] += 1
            return statistics.median(times) / 1e6
        return run

    rows = interleaved({name: timed(name) for name in names}, rounds, before=comm.control_barrier)
    for row in rows:
        row["first"] = row["first"].split()[0]
    return rows


def strategy_trainer(cfg, comm, batches, micro_batches=lambda batch: [batch]):
    """A step of commprof's strategy, recording on, as commprof.run.loop.train runs it; returns
    (step, params, strategy). `micro_batches(batch)` is what train_step gets for one pre-built batch."""
    from commprof.record.phases import Phases
    from commprof.record.volume import step_volume
    from commprof.run.loop import build
    from commprof.strategies import STRATEGIES

    _, spec = build(cfg)
    strategy = STRATEGIES[cfg.strategy](spec=spec, comm=comm, config=cfg)
    phases, recorder = Phases(comm.recorder), comm.recorder
    spec.module.train()

    def step(i: int) -> float:
        phases.begin(i)
        loss = strategy.train_step(micro_batches(batches[i % len(batches)]), phases).loss
        phases.end()
        step_volume(phases.ops())
        recorder.clear()
        return loss

    def params() -> list:
        state = strategy.full_state()
        return [state[name] for name, _ in spec.module.named_parameters()]

    return step, params, strategy


# ---- interleaved arms and their ratio ----------------------------------------------------------------
def order(arms: Sequence, r: int) -> list:
    """Round r's order of the arms: as given on even rounds, reversed on odd ones, so none always goes first."""
    return list(arms) if r % 2 == 0 else list(arms)[::-1]


def interleaved(arms: dict[str, Callable[[], Any]], rounds: int, *,
                before: Callable[[], Any] | None = None) -> list[dict]:
    """Every arm once per round, in `order`, `before()` ahead of each (a barrier); per round
    {"first": the arm that went first, arm: what it returned, …}."""
    out = []
    for r in range(rounds):
        names = order(arms, r)
        row: dict[str, Any] = {"first": names[0]}
        for name in names:
            if before is not None:
                before()
            row[name] = arms[name]()
        out.append(row)
    return out


def ratio_ci(num: Sequence[float], den: Sequence[float]) -> dict:
    """The per-round ratios num/den: their median, its 95 % CI (median_ci) and the number of rounds."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return {"ratio": statistics.median(ratios), "ci95": median_ci(ratios), "rounds": len(ratios)}


# ---- workloads several benchmarks train: one training step each, run in a rank ------------------------
def ddp(model_name: str, device):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(image_model(model_name).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
    return classifier_step(model, opt, x, y), lambda: None


def classifier_step(model, opt, x, y):
    """One step of a classifier on one batch: cross-entropy, backward, the optimizer's step."""
    import torch

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def fsdp2(_, device):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    width, vocab = 128, 512

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.attn = torch.nn.MultiheadAttention(width, 4, batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    model = torch.nn.Sequential(torch.nn.Embedding(vocab, width), *(Block() for _ in range(4)),
                                torch.nn.Linear(width, vocab)).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model[1:5]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (8, 64), generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    return step, lambda: {k: v.full_tensor() for k, v in model.state_dict().items()}


def pipeline(_, device):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    module = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4))).to(device)
    stage = PipelineStage(module, rank, world, device)
    schedule = ScheduleGPipe(stage, 8, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 256, generator=g).to(device), torch.randn(64, 256, generator=g).to(device)

    def step():
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()

    return step, lambda: None


def fsdp2_units(_, device):
    """One training step of many small FSDP2 units, shaped like PyTorch's FSDP2 example
    (distributed/FSDP2/example.py): profile_cost.py's workload of that name, and interception_cost.py's."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    width, heads, vocab, seq, batch, n_blocks = 16, 4, 1024, 64, 32, 10

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(3))
            self.proj = torch.nn.Linear(width, width, bias=False)
            self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (lin(self.ln1(x)).view(b, t, heads, -1).transpose(1, 2) for lin in self.qkv)
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, width))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(vocab, width), torch.nn.Embedding(seq, width)
            self.layers = torch.nn.ModuleList(Block() for _ in range(n_blocks))
            self.norm, self.out = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for layer in self.layers:
                h = layer(h)
            return self.out(self.norm(h)).float()

    model = Model().to(device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    blocks = list(model.layers)
    for i, layer in enumerate(blocks):  # prefetch two blocks ahead, forward and backward
        if i + 2 < n_blocks:
            layer.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
        if i >= 2:
            layer.set_modules_to_backward_prefetch([blocks[i - 1], blocks[i - 2]])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def step():
        model.unshard()
        x = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad()

    return step, lambda: None


# ---- a straggler every other step -----------------------------------------------------------------------
def alternating_ratios(trace_dir: str, delay_ms: float, slow: int) -> dict:
    """From the trace of a job whose rank `slow` was slept `delay_ms` before every other step: each delayed
    iteration's step without the straggler (that iteration alone replayed, commprof/findings/whatif.py) over the
    mean measured step of the balanced iterations on either side of it, a control from the same moment of the
    machine; beside it, a balanced iteration over the balanced ones two away on either side (the same comparison
    with nothing to take away). findings.py and findings_workloads.py read their alternating jobs with it."""
    from dataclasses import replace

    from commprof.findings import whatif
    from commprof.findings.arrivals import analyze
    from commprof.perfmodel import timeline

    m = timeline.load(trace_dir)
    analysis = analyze(m)
    walls = [max(p.wall_ms for p in it) for it in m.iterations]
    own = [[sum(s[1] for s in p.steps if s[0] == "busy") for p in it] for it in m.iterations]
    delayed = [o[slow] - statistics.median(o[:slow] + o[slow + 1:]) > delay_ms / 2 for o in own]
    ratios, controls = [], []
    for i in range(1, len(walls) - 1):
        if delayed[i] and not (delayed[i - 1] or delayed[i + 1]):
            without = whatif.without_straggler(replace(m, iterations=(m.iterations[i],)), analysis, slow)
            ratios.append(without / statistics.fmean([walls[i - 1], walls[i + 1]]))
        elif 2 <= i < len(walls) - 2 and not (delayed[i] or delayed[i - 2] or delayed[i + 2]):
            controls.append(walls[i] / statistics.fmean([walls[i - 2], walls[i + 2]]))
    return {"delayed_iterations": sum(delayed), "iterations": len(walls), "pairs": len(ratios),
            "late_ops_priced_aligned": whatif.priced_aligned(analysis, slow),
            "without_over_neighbours": statistics.median(ratios) if ratios else None,
            "without_over_neighbours_ci95": median_ci(ratios) if len(ratios) > 2 else None,
            "balanced_over_neighbours": statistics.median(controls) if controls else None,
            "balanced_over_neighbours_ci95": median_ci(controls) if len(controls) > 2 else None}
