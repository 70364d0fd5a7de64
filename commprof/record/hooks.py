"""Iterations and phases of a script commprof did not write, found from PyTorch's own hooks.

    tracker = hooks.install(recorder)   # before the script runs
    ...                                 # the script trains
    tracker.finish()                    # its iterations, split as `commprof run` splits its own

Iterations end where the first optimizer to step steps (a global optimizer-step post hook), and the next one
begins there; the first begins at the first forward, backward or step. Phases, each an NVTX range as in
`commprof run`: "forward" is the outermost module call (global module forward hooks; a module called inside
backward, as activation checkpointing does, is "recompute"); "backward" spans `torch.autograd.backward`
(what `loss.backward()` calls) up to the moment autograd has run every node; "step" spans optimizer.step;
"data" is the time from the iteration's start to its first forward.

Why backward stops short of its return: DistributedDataParallel's reducer waits for its bucket all-reduces
in a callback autograd runs after the last node, from C++ where no Comm wait is seen. A callback queued when
backward starts runs before the reducer's, so it marks where computing ended; from there to backward's
return the training thread was blocked on comm, and that span (clipped to the last op still in flight) is
recorded as a wait — exposed time, as a Handle's wait would be. Only a process that has built such a reducer
(`torch.distributed.Reducer`: DDP's, `replicate`'s) marks its backwards: the mark costs ~25 µs a backward
(a hook on the graph's root and a queued callback), and a pipeline runs a backward per micro-batch with no
C++ wait after any (GPipe's 8 a step cost each rank 0.28 ms of CPU, 3 % of it). Elsewhere backward ends at
its return, and whatever Python callbacks autograd runs at its end (FSDP's, which wait through Comm) are
part of it.

A script may mark its own: `commprof.step()` ends an iteration (optimizer hooks then end none), and
`with commprof.phase("forward"):` records that phase (automatic phases then stop, for the rest of the run).
Both do nothing when the script is not profiled. Exercised by: `pytest tests/test_profile_cli.py`.
"""

from __future__ import annotations

import sys
import time
import warnings
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.compiler import is_compiling
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim

from commprof.record import aligned as aligned_iterations
from commprof.record.annotate import ANNOTATOR, MEASURED, phase_category
from commprof.record.phases import Phases
from commprof.record.recorder import END, GROUP, HOST, START
from commprof.record.volume import step_volume

MS = 1e-6


class Tracker:
    """One rank's iterations, phases and volume, from hooks."""

    def __init__(self, recorder, warmup: int) -> None:
        self.recorder = recorder
        self.warmup = warmup
        self.phases = Phases(recorder, recorder.clock)
        """On CUDA (NCCL's ops timed by events) the phases are events on the current stream too: the split
        is the device's timeline, as `commprof run` splits it."""
        self.progress = None
        """A StepProgress (report/progress.py) that sees every iteration end, on rank 0's terminal."""
        self.on_end = None
        """Called after every measured iteration (rank 0 keeps its results as they grow: commprof/launcher/kept.py)."""
        self.live = None
        """Called with each measured iteration's figures, op log entries and waits (live/monitor.py)."""
        self.keep: int | None = None
        """The most measured iterations `iterations` and `volumes` hold (the latest); None: every one."""
        self.fault = None
        """The rank's fault injector (comm/failure/faults.py), told each iteration's index (`from_step`)."""
        self.iterations: list[dict] = []
        """Measured iterations, in `commprof run`'s per-iteration form."""
        self.volumes: list[dict] = []
        """Per measured iteration: step_volume of its ops."""
        self.outside: list[tuple] = []
        """Op log entries of no iteration: set-up before the first, and whatever follows the last step."""
        self.index = 0
        self.open = False
        self.manual = False
        self.explicit = False
        self._optimizer = None
        self._depth = 0
        self._backward = 0
        self._started = 0
        self._spans_at_begin = 0
        self._stack: list[tuple[str, int]] = []
        self._handles: list = []
        self._modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._measuring = False
        """The range around the measured iterations is pushed."""
        self.reducer = False
        """A C++ reducer (DDP's) was built in this process: backwards mark their last node (see above)."""
        self._ended_ns: int | None = None
        """When the last measured iteration ended (perf_counter_ns, the trace's clock)."""

    # ---- iterations ---------------------------------------------------------------------------
    def begin(self) -> None:
        if self.open:
            return
        self._take_outside()
        if self.index == self.warmup:
            ANNOTATOR.push(ANNOTATOR.label(MEASURED, "iteration"))
            self._measuring = True
        if self.fault is not None:
            self.fault.step = self.index
        self.phases.begin(self.index, aligned=0 < self.index < self.warmup)  # record/aligned.py
        self._started = self.phases.now()
        self.open = True

    def end(self) -> None:
        if not self.open:
            return
        while self._stack:  # a phase left open (an exception inside it) ends with the iteration
            self.close_phase()
        split = self.phases.end()
        if self.index >= self.warmup:
            self._ended_ns = self.phases.ended_ns  # the measured range ends on the very stamp this one did
            ops = self.phases.ops()
            self.iterations.append({"step": self.index, **split.figures()})
            self.volumes.append(step_volume(ops))
            if self.live is not None:
                self.live(self.iterations[-1], ops, self.phases.waits())
            if self.keep is not None and len(self.iterations) > self.keep:
                del self.iterations[0], self.volumes[0]
        else:
            self.outside += self.phases.ops()
        first, last, waits = self.phases.read()
        self.outside += self.recorder.ops[:first]  # logged after the last take, before this iteration began
        self.recorder.drop(last, waits)
        self.index += 1
        if self.progress is not None:
            self.progress.advance(split.wall_ns * MS)
        if self.on_end is not None and self.index > self.warmup:
            self.on_end()
        self.open = False

    def _take_outside(self) -> None:
        """Move the log's ops, none of an iteration, to `outside`: those read, so that an async op a backend
        thread logs between the read and the removal is not lost but taken next."""
        ops = self.recorder.ops[:]
        self.outside += ops
        self.recorder.drop(len(ops), len(self.recorder.waits))

    def step(self) -> None:
        """The script's own end of an iteration (commprof.step())."""
        if not self.manual:
            self.manual = True
            if self.open and len(self.phases.spans) == 0 and len(self.recorder.ops) == 0:
                return  # an optimizer hook had just begun this one: it is the iteration that ends now
        self.begin()
        self.end()

    def finish(self) -> None:
        """The script has ended: an iteration no step ended is not one; its ops are outside."""
        while self._stack:
            self.close_phase()
        # The last optimizer step began an iteration that no step ended (the script's teardown): in the
        # trace it is none, and the measured range ends with the last iteration that is one. NVTX's ranges
        # were pushed by then and go as they are.
        if self.open:
            ANNOTATOR.pop_unfinished()
            self.open = False
            if self.phases.aligned:  # the script stepped no further than its aligned iteration
                aligned_iterations.stop(self.recorder)
                self.phases.aligned = False
        if self._measuring:
            ANNOTATOR.pop_unfinished(self._ended_ns)
            self._measuring = False
        self._take_outside()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ---- phases -----------------------------------------------------------------------------
    def open_phase(self, name: str) -> None:
        self.begin()
        ANNOTATOR.push(ANNOTATOR.label(name, phase_category(name)))
        self._stack.append((name, self.phases.now()))

    def close_phase(self, end: int | None = None) -> None:
        name, start = self._stack.pop()
        self.phases.spans.append((name, start, end if end is not None else self.phases.now()))
        ANNOTATOR.pop()

    @contextmanager
    def phase(self, name: str):
        """The script's own phase (commprof.phase(name)); automatic phases stop from here on."""
        self.explicit = True
        self.open_phase(name)
        try:
            yield
        finally:
            self.close_phase()

    # ---- the hooks --------------------------------------------------------------------------
    def _trains(self, module) -> bool:
        """Whether `module` holds parameters: parameter-free modules called outside a model (torchvision's
        transforms are modules) are not forward passes."""
        hit = self._modules.get(module)
        if hit is None:
            hit = self._modules[module] = next(module.parameters(), None) is not None
        return hit

    # Each hook returns at once while torch.compile traces it (is_compiling() is True then, only then): a
    # compiled graph holds none of commprof's state, and the module torch.compile wraps is timed eagerly around it
    def _forward_pre(self, module, args) -> None:
        if is_compiling() or (self._depth == 0 and not self._trains(module)):
            return
        self._depth += 1
        if self._depth == 1 and not self.explicit:
            self.begin()
            if not self.phases.spans and not self._stack:  # the iteration's input pipeline came first
                self.phases.spans.append(("data", self._started, self.phases.now()))
            self.open_phase("recompute" if self._backward else "forward")

    def _forward_post(self, module, args, output) -> None:
        if self._depth == 0 or is_compiling():
            return
        self._depth -= 1
        if self._depth == 0 and not self.explicit and self._stack:
            self.close_phase()

    def _step_pre(self, optimizer, args, kwargs) -> None:
        if is_compiling():
            return
        if self._optimizer is None:
            self._optimizer = optimizer
        if not self.explicit:
            self.open_phase("step")

    def _step_post(self, optimizer, args, kwargs) -> None:
        if is_compiling():
            return
        if not self.explicit and self._stack:
            self.close_phase()
        if optimizer is self._optimizer and not self.manual:
            self.end()
            self.begin()

    def backward(self, original, tensors, *args, **kwargs):
        """torch.autograd.backward, timed as "backward" with its wait on comm split off."""
        self.begin()
        if not self.explicit:
            self.open_phase("backward")
        self._backward += 1
        computed = None
        try:
            if not self.reducer:  # nothing waits in C++ after the last node: backward ends at its return
                original(tensors, *args, **kwargs)
            else:
                run = lambda: original(tensors, *args, **kwargs)  # noqa: E731
                computed = (split_backward(self.recorder, tensors, run) if not self.phases.cuda
                            else stream_backward(self.phases.now, tensors, run))
        finally:
            self._backward -= 1
            if not self.explicit and self._stack:
                self.close_phase(computed)

    def install(self) -> None:
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
            optim.register_optimizer_step_pre_hook(self._step_pre),
            optim.register_optimizer_step_post_hook(self._step_post),
        ]


def split_backward(recorder, tensors, run) -> int:
    """Run `run()`, a backward pass from `tensors`; return when autograd had run its last node
    (perf_counter ns), and record the rest — a C++ reducer waiting on comm — as a wait in `recorder`."""
    first_op, start = len(recorder.ops), time.perf_counter_ns()
    try:
        computed = _marking_last_node(tensors, run, time.perf_counter_ns)
    finally:
        end = time.perf_counter_ns()
    computed = computed if computed is not None else end
    mine = [op for op in recorder.ops[first_op:] if op[HOST] and op[START] >= start]
    last = max((op[END] for op in mine), default=computed)
    if min(end, last) > computed:
        recorder.waits.append(("all_reduce", computed, min(end, last)))
        if ANNOTATOR.trace is not None:  # the trace's training thread shows the wait its figures count
            group = max(mine, key=lambda op: op[END])[GROUP]
            ANNOTATOR.trace.span(ANNOTATOR.label(f"wait all_reduce ({group})", "wait"), computed, min(end, last))
    return computed


def stream_backward(now, tensors, run):
    """Run `run()`, a backward pass, on CUDA; return an event recorded once autograd had run its last node
    (on the stream its callbacks run with, which waits for the backward's streams). Comm the reducer waits
    on is stream-ordered: the device's timeline splits it (phases.breakdown), no host wait is recorded."""
    computed = _marking_last_node(tensors, run, now)
    return computed if computed is not None else now()


def _marking_last_node(tensors, run, stamp):
    """Run `run()`, a backward pass from `tensors`; return `stamp()` as taken by the first callback autograd
    runs after its last node, or None where the pass had no graph."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    node = next((t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    marks: list = []
    hook = None
    if node is not None and not _compiled_autograd():
        def queue(*_):
            if not marks and not _compiled_autograd():  # once: the first callback autograd runs after its last node
                marks.append(None)
                torch.autograd.Variable._execution_engine.queue_callback(lambda: marks.append(stamp()))
        hook = node.register_prehook(queue)
    try:
        run()
    finally:
        if hook is not None:
            hook.remove()
    return marks[1] if len(marks) > 1 else None


def _compiled_autograd() -> bool:
    """Compiled autograd runs this backward (its `_enable` context, as PyTorch's tutorial writes it, or the
    hook being traced): it traces the graph's hooks, and a callback queued there needs fullgraph=True, so
    backward then ends at its return (DDP's python reducer waits through Comm inside the graph anyway)."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(ca.compiled_autograd_enabled or ca.in_compiled_autograd_region)


ACTIVE: Tracker | None = None
"""The tracker of the script being profiled in this process; None when none is."""
_SAVED: dict = {}
"""torch's own of what install() replaced besides backward: the Reducer DDP builds."""


def install(recorder, warmup: int) -> Tracker:
    """Hook this process's modules, optimizers and autograd; returns the Tracker."""
    global ACTIVE
    tracker = ACTIVE = Tracker(recorder, warmup)
    tracker.install()
    # torch warns of global module hooks at every torch.compile(module) call: they are commprof's, not the
    # script's, and a plain run says nothing (an extra call of the compiled wrapper is an outer module call,
    # which the hooks already take as the same forward)
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                            category=UserWarning)
    original = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        return tracker.backward(original, tensors, *args, **kwargs)

    backward.__wrapped__ = original
    backward.__doc__ = original.__doc__
    torch.autograd.backward = backward
    if dist.is_available():
        _SAVED["reducer"] = built = dist.Reducer

        class Reducer(built):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                tracker.reducer = True

        dist.Reducer = Reducer
    return tracker


def uninstall() -> None:
    global ACTIVE
    if ACTIVE is not None:
        ACTIVE.finish()
    backward = torch.autograd.backward
    torch.autograd.backward = getattr(backward, "__wrapped__", backward)
    if "reducer" in _SAVED:
        dist.Reducer = _SAVED.pop("reducer")
    ACTIVE = None


def step() -> None:
    """End an iteration here (the script's own mark); nothing when the script is not profiled."""
    if ACTIVE is not None:
        ACTIVE.step()


@contextmanager
def phase(name: str):
    """Time the block as phase `name` ("forward", "backward", "step", "data", …); nothing when not profiled."""
    if ACTIVE is None:
        yield
        return
    with ACTIVE.phase(name):
        yield
