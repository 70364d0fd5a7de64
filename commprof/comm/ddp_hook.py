"""DistributedDataParallel's traffic through Comm: its bucket all-reduces (a comm hook) and its buffer
broadcasts, which its C++ reducer and `_broadcast_coalesced` would otherwise send where nothing sees them.

    ddp_hook.install(interposer)   # every DDP built from now on: buckets and buffers through the
                                   # Comm of its process group

The hook is the same arithmetic as DDP's default one (each bucket divided by the group's size, summed
across ranks: an average), registered on the first forward unless the script registered a hook of its
own by then — DDP takes one — whose collectives, made through `torch.distributed`, are interposed anyway.
The initial parameter broadcast of DDP's constructor and the unused-parameter bitmap of
`find_unused_parameters` stay in C++: not seen. Exercised by: `pytest tests/test_profile_cli.py -k ddp`.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

_SAVED: dict = {}


def _all_reduce_hook(comm, bucket):
    buffer = bucket.buffer()
    buffer.div_(comm.world_size)
    handle = comm.all_reduce(buffer, async_op=True)
    return handle.get_future().then(lambda _: buffer)


def install(interposer) -> None:
    """Patch DDP so each instance routes its traffic through `interposer`'s Comms."""
    if _SAVED:
        return
    _SAVED.update(register_comm_hook=DDP.register_comm_hook,
                  broadcast=DDP._distributed_broadcast_coalesced, forward=DDP.forward)
    register = _SAVED["register_comm_hook"]

    def register_comm_hook(self, state, hook):
        self._commprof_hooked = True  # the script's own hook: DDP takes one, ours stands aside
        return register(self, state, hook)

    def forward(self, *args, **kwargs):
        if not getattr(self, "_commprof_hooked", False):
            self._commprof_hooked = True
            register(self, interposer.comm(self.process_group), _all_reduce_hook)
        return _SAVED["forward"](self, *args, **kwargs)

    def broadcast(self, tensors, buffer_size, authoritative_rank=0):
        tensors = list(tensors)
        if not tensors:
            return
        # one flat broadcast per dtype: the bytes of torch's coalesced one, through Comm
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            group = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            interposer.comm(self.process_group).broadcast(flat, src=authoritative_rank)
            for t, piece in zip(group, flat.split([t.numel() for t in group])):
                t.detach().copy_(piece.view(t.shape))

    DDP.register_comm_hook = register_comm_hook
    DDP.forward = forward
    DDP._distributed_broadcast_coalesced = broadcast


def uninstall() -> None:
    if _SAVED:
        DDP.register_comm_hook = _SAVED["register_comm_hook"]
        DDP.forward = _SAVED["forward"]
        DDP._distributed_broadcast_coalesced = _SAVED["broadcast"]
        _SAVED.clear()
