"""The rendezvous store listens on the address it is named, says in one line when this host does not hold
that address, and listens on every interface where COMMPROF_STORE_BIND says so."""

import pytest

from commprof.comm.store import listen
from commprof.errors import UsageError


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
