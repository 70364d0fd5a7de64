"""What of commprof's runs inside a script's process, kept out of torch.compile's reach.

    opaque(SomeBackend)   # every function of the class: never traced by dynamo, from wherever it is called
    opaque(kernel)        # one function

C++ calls Python back — a process group's Python backend from DDP's reducer (its bucket-order broadcast at
the second forward, inside a compiled DDP's `_pre_forward`), a torch.library kernel from a compiled graph, a
future's callback — and while compiled code runs, dynamo's frame callback would try to trace such a frame:
it fails on the ProcessGroup it holds (`UnsafeScriptObjectError … 'broadcast'`) or records commprof's state
as the graph's. Each code object marked here is run as plain Python, and so is every frame it calls
(dynamo's own "skip, recursively" strategy, what `torch.compiler.disable` sets up per call, set once on the
code instead: no wrapper frame per op). Module and optimizer hooks, which dynamo inlines while it traces a
module rather than calling them as frames, ask `torch.compiler.is_compiling()` first instead
(record/hooks.py): a compiled graph holds no hook of commprof's, and the hooks of the module torch.compile
wraps still run, eagerly, around it.

Exercised by: `pytest tests/test_profile_compiled.py`.
"""

from __future__ import annotations

import inspect

from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

_SKIP = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
"""This frame, and every frame it calls, run without dynamo."""


def opaque(target):
    """`target` (a function, or a class: each function defined on it and its bases of commprof's), marked so
    that dynamo never traces it; returned as is."""
    if inspect.isclass(target):
        for klass in target.__mro__:
            if klass.__module__.startswith("commprof."):
                for value in vars(klass).values():
                    _mark(value)
        return target
    _mark(target)
    return target


def _mark(value) -> None:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        for accessor in (value.fget, value.fset):
            if accessor is not None:
                _mark(accessor)
        return
    code = getattr(value, "__code__", None)
    if code is not None:
        set_code_exec_strategy(code, _SKIP)
