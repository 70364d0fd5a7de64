"""torch.compile traces a profiled script as it would the plain one: while dynamo compiles, torch.distributed's
names are torch's own again.

    compiling.install(hide, show)   # hide() when a compilation starts, show() when it ends
    compiling.uninstall()

Dynamo turns a traced `dist.all_reduce(t)` into a functional collective only when the name it reads *is*
torch's function (and it compares the call with `dist.all_reduce` as it is bound then); it would trace into
commprof's wrapper instead, and break the script's graph inside commprof's code. So torch's names are put back
for the length of each compilation, through dynamo's own compile callbacks
(`torch._dynamo.callback_handler`), and commprof's rebound when it ends: the compiled graph holds torch's
functional collective, counted when it runs (intercept/functional.py), and a call dynamo cannot put in a
graph breaks it where it would without commprof, then runs eagerly through commprof's wrapper. An op another
thread issues by name during a compilation runs as torch's own: on gloo, the group's backend still sees it
(intercept/seen.py).

Importing torch._dynamo costs about 1.8 s, so nothing here imports it: the callbacks are registered as soon as
the script (or torch.compile) imports `torch._dynamo.callback`, by a finder on sys.meta_path, or at once if it
is already imported.

Exercised by: `pytest tests/test_profile_compiled.py`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from commprof.intercept.opaque import opaque

MODULE = "torch._dynamo.callback"

_STATE: dict = {}


def install(hide, show) -> None:
    """Call `hide(args)` as each compilation starts and `show(args)` as it ends, from now until uninstall()."""
    if _STATE:
        return
    _STATE.update(hide=opaque(hide), show=opaque(show))
    loaded = sys.modules.get(MODULE)
    if loaded is not None:
        _register(loaded)
    else:
        finder = _STATE["finder"] = _Finder()
        sys.meta_path.insert(0, finder)


def uninstall() -> None:
    finder = _STATE.get("finder")
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)
    handler = _STATE.get("handler")
    if handler is not None:
        handler.remove_start_callback(_STATE["hide"])
        handler.remove_end_callback(_STATE["show"])
    _STATE.clear()


def _register(module) -> None:
    handler = _STATE["handler"] = module.callback_handler
    handler.register_start_callback(_STATE["hide"])
    handler.register_end_callback(_STATE["show"])


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo.callback is imported, registers the callbacks once the module
    has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE or not _STATE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            if _STATE:
                _register(module)

        spec.loader.exec_module = exec_module
        sys.meta_path.remove(self)
        return spec
