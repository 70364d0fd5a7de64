"""The interception layer: everything commprof puts into a profiled script's process, installed and removed
as one, so that every op the script's process groups carry is timed, counted and NVTX-wrapped by Comm, or
listed in `unseen` by name.

    with Interception(recorder, warmup=2, joining=joining, on_default_group=adopt, on_destroy=gather) as caught:
        runpy.run_path(script)          # the script, unchanged
    caught.interposer.unseen            # what ran as torch's own, by name
    caught.tracker.iterations           # its iterations and phases

Mechanism (lowest first)          what it catches                                             file
the group's CPU backend           every op reaching a gloo group however it was made (C++,    seen.py
                                  `pg.allreduce`, DeviceMesh, new_group): through its Comm
the default group's life          born by init_process_group (the job's defaults, its         groups.py
                                  rendezvous: `joining`), adopted however made (any name,
                                  DeviceMesh's own: `on_default_group`), `on_destroy` before
                                  destroy_process_group
DDP's reducer group               bucket all-reduces, as async ops the reducer waits on       ddp_reducer.py
functional-collective kernels     DTensor, TP, FSDP2's clip and compiled graphs' collectives  functional.py
torch.distributed's names         the Python call: its async Work, its name, forms gloo sends  interpose.py,
                                  as one op (coalesced, object collectives' pieces)           interposer.py,
                                                                                              work.py
module/optimizer/autograd hooks   iterations and phases (not comm)                            record/hooks.py
and the Reducer class DDP builds  whether a C++ reducer waits after backward's last node
dynamo's compile callbacks        torch's own names while torch.compile traces: a traced call compiling.py
                                  becomes torch's functional collective, counted as it runs

Why the Python wrappers stay above the backend: a backend sees a call's tensors and options but not its
Python name (`all_gather_object`'s two all_gathers), not its async Work as the script waits on it (the wait
is the exposed time), and not a reducer's bucket as a bucket; each wrapper's module says what it adds.
Every callable of commprof's that C++ or compiled code can reach is opaque to torch.compile (opaque.py).

Exercised by: `pytest tests/test_profile_compiled.py tests/test_profile_cli.py`.
"""

from __future__ import annotations

from commprof.intercept import ddp_reducer, functional, interpose, interposer, seen
from commprof.intercept.groups import DefaultGroup
from commprof.record import hooks


class Interception:
    """The script's process, intercepted: a context manager that installs every mechanism on entry and
    removes every one on exit, whatever failed."""

    def __init__(self, recorder, *, warmup: int, route_ddp: bool = True, joining=None, backend: str | None = None,
                 on_default_group=None, on_destroy=None) -> None:
        self.recorder = recorder
        """The op log and clock every group's Comm shares."""
        self.warmup = warmup
        """Iterations before the measured ones (the tracker's)."""
        self.route_ddp = route_ddp
        """Route DDP's reducer through Comm (`--no-ddp-reducer` turns it off: buckets then reach the backend)."""
        self.default_group = DefaultGroup(joining, backend=backend, adopt=on_default_group, dying=on_destroy)
        """The default group's life (groups.py): the script's init_process_group joins the job through `joining`
        (comm/joining.py; None: torch's own), naming `backend` where the script names none (None: torch's
        choice); `on_default_group(pg, timeout_s)` once torch has made it, however the script made it;
        `on_destroy()` before the script destroys it."""
        self.interposer: interposer.Interposer | None = None
        self.tracker: hooks.Tracker | None = None

    def __enter__(self) -> Interception:
        try:
            self.interposer = interpose.install(self.recorder)
            if self.route_ddp:
                ddp_reducer.install(self.interposer)
            functional.install(self.interposer)
            seen.install(self.interposer)
            self.default_group.install()
            self.tracker = hooks.install(self.recorder, self.warmup)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        hooks.uninstall()
        self.default_group.uninstall()
        seen.uninstall()
        functional.uninstall()
        ddp_reducer.uninstall()
        interpose.uninstall()
