"""Rank 0's TCPStore — the rendezvous and the control plane — listening on one address, never the wildcard:
the store is unauthenticated, and whoever reaches it can write the keys every rank exits on.

    store = open_store(addr, port, rank=rank, world_size=n, timeout_s=60)   # rank 0 serves, others connect

The listening socket is bound here and handed to torch (TCPStore's `master_listen_fd`, as torchrun's agent
does): to `addr` as rank 0 resolves it — 127.0.0.1 for a local job, MASTER_ADDR's interface for a job across
hosts. COMMPROF_STORE_BIND names another address to listen on (0.0.0.0 for every interface), for a rank 0
known to its peers by an address it does not hold itself (NAT). Exercised by:
`pytest tests/unit/test_store_address.py tests/test_signals.py`.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

from commprof.base.errors import UsageError

BIND_ENV = "COMMPROF_STORE_BIND"


def open_store(addr: str, port: int, *, rank: int, world_size: int, timeout_s: float, serve: bool | None = None):
    """The job's TCPStore at addr:port; served by this process when `serve` (default: rank 0). Port 0 on the
    serving rank picks a free one (the store's `.port`)."""
    import torch.distributed as dist

    if serve is None:  # under torchrun its agent serves the store already (as torch's own rendezvous reads it)
        serve = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    timeout = timedelta(seconds=timeout_s)
    if not serve:
        left = _until_listening(addr, port, timeout_s)
        store = dist.TCPStore(addr, port, world_size, False, timedelta(seconds=max(left, 1.0)))
        store.set_timeout(timeout)  # the connect's own bound was what the wait above left; the calls' is timeout
        return store
    sock = listen(addr, port)
    try:
        store = dist.TCPStore(addr, sock.getsockname()[1], world_size, True, timeout, wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the descriptor is the store's now: it listens on it for the life of the process
    return store


def _until_listening(addr: str, port: int, timeout_s: float) -> float:
    """Wait until addr:port accepts a connection, at most `timeout_s`; the seconds left of it. TCPStore's client,
    refused once, waits out a backoff of about half a second before it tries again, and ranks started at once
    are refused nearly always: rank 0 listens only once it has read its command line."""
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic())).close()
            break
        except OSError:
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
    return deadline - time.monotonic()


def listen(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on `addr` (or COMMPROF_STORE_BIND) and `port`."""
    where = os.environ.get(BIND_ENV) or addr
    try:
        infos = socket.getaddrinfo(where, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"cannot resolve the rendezvous address {where!r}: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        hint = (f"; set {BIND_ENV}=0.0.0.0 to listen on every interface"
                if exc.errno == 99 else "")  # EADDRNOTAVAIL: not an address of this host
        raise UsageError(f"rank 0 cannot listen on {where}:{port} for the rendezvous ({exc.strerror}){hint}") from None
    sock.listen(1024)
    return sock
