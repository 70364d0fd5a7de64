"""free_port() keeps the port it gives bound until it is released: rank 0's store binds and listens on it
(SO_REUSEADDR, as torch's TCPStore does), while no other bind(0) on the host is handed it meanwhile."""

import datetime
import socket

from commprof.base.backends import free_port, release_port


def test_a_held_port_is_passed_by_yet_the_store_binds_it():
    import torch.distributed as dist

    port = free_port()
    try:
        others = set()
        for _ in range(2000):  # what another job's gloo listeners would be given
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                others.add(s.getsockname()[1])
        assert port not in others
        store = dist.TCPStore("127.0.0.1", port, 1, True, datetime.timedelta(seconds=5))
        store.set("k", "v")
        assert store.get("k") == b"v"
        del store
    finally:
        release_port(port)
    with socket.socket() as s:  # released: an ordinary bind takes it
        s.bind(("127.0.0.1", port))
    release_port(port)  # twice, or a port never held: nothing
