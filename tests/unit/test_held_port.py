"""HeldPort (tests/integration/helpers.py), the integration tests' port for a process that
binds it itself: while held, nothing else gets the number, the process still listens on
it (rtrain's store and metrics server, torch's TCPStore), and with no listener a
connection is refused."""

from __future__ import annotations

import errno
import socket
import urllib.request

import pytest

from rtrain.agent.observe.metrics_http import MetricsServer
from rtrain.agent.store.opening import listening_socket
from tests.integration.helpers import HeldPort


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_held_port_is_nobody_elses_and_refuses_connections() -> None:
    with HeldPort() as held:
        assert held.port > 0 and _refused("127.0.0.1", held.port)
        with pytest.raises(OSError) as plain, socket.socket() as other:
            other.bind(("127.0.0.1", held.port))
        assert plain.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError) as again:
            HeldPort(held.port)
        assert again.value.errno == errno.EADDRINUSE
        picked = [socket.socket() for _ in range(200)]
        try:
            for sock in picked:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", 0))
            assert held.port not in {sock.getsockname()[1] for sock in picked}
        finally:
            for sock in picked:
                sock.close()
    with socket.socket() as after:
        after.bind(("127.0.0.1", held.port))  # let go at close()


def test_the_store_and_the_metrics_server_listen_on_a_held_port() -> None:
    with HeldPort() as held:
        store = listening_socket("127.0.0.1", held.port)  # as a store host binds it
        assert store is not None
        with store, socket.create_connection(("127.0.0.1", held.port), timeout=5) as client:
            accepted, peer = store.accept()
            accepted.close()
            assert peer == client.getsockname()  # the store's listener took it
        assert _refused("127.0.0.1", held.port)  # the listener gone, the port still held
        metrics = MetricsServer("127.0.0.2", held.port, lambda: "up 1\n")
        try:
            url = f"http://127.0.0.2:{held.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.read() == b"up 1\n"
            assert _refused("127.0.0.1", held.port)  # its own address alone
        finally:
            metrics.close()


def test_torchs_tcpstore_listens_on_a_held_port() -> None:
    """torchrun's store (--master-port) and a store on a name, listened on everywhere."""
    import datetime

    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=10)
    with HeldPort() as held:
        for libuv in (True, False):
            server = TCPStore(
                "localhost", held.port, is_master=True, wait_for_workers=False, use_libuv=libuv
            )
            client = TCPStore("127.0.0.1", held.port, is_master=False, timeout=timeout)
            server.set("key", "value")
            assert client.get("key") == b"value"
            del client, server
