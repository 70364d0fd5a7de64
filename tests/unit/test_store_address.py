"""The rendezvous store listens on the address it is named, says in one line when this host does not hold
that address, and listens on every interface where COMMPROF_STORE_BIND says so; a client started first waits
for it to listen."""

import pytest

from commprof.base.errors import UsageError
from commprof.comm.store import listen


def test_the_store_listens_on_the_named_address_and_says_when_it_cannot(monkeypatch):
    sock = listen("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()
    with pytest.raises(UsageError, match=r"rank 0 cannot listen on 192\.0\.2\.254:0 .*COMMPROF_STORE_BIND=0\.0\.0\.0"):
        listen("192.0.2.254", 0)  # TEST-NET-1: an address this host does not hold
    monkeypatch.setenv("COMMPROF_STORE_BIND", "0.0.0.0")
    sock = listen("192.0.2.254", 0)
    try:
        assert sock.getsockname()[0] == "0.0.0.0"
    finally:
        sock.close()


def test_a_client_started_before_its_store_waits_for_it_and_keeps_its_timeout():
    # refused at first, TCPStore's client would wait out a backoff; open_store waits for the store to listen
    # instead, then connects with what is left of the timeout and gives its calls the whole of it
    import threading
    from datetime import timedelta

    from commprof.base.backends import free_port, release_port
    from commprof.comm.store import open_store

    port = free_port()
    served = {}
    late = threading.Timer(0.2, lambda: served.update(store=open_store("127.0.0.1", port, rank=0, world_size=2,
                                                                         timeout_s=30)))
    late.start()
    try:
        client = open_store("127.0.0.1", port, rank=1, world_size=2, timeout_s=30)
        late.join()
        client.set("rank1", "here")
        assert served["store"].get("rank1") == b"here"
        assert client.timeout == timedelta(seconds=30)
    finally:
        late.cancel()
        release_port(port)
