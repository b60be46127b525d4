"""TCPStoreReader (agent/store/tcpstore_wire.py), the torch-free client `rtrain status`
reads a TCPStore with: against the installed torch's real TCPStore, both server
backends, it reads what torch's own client reads and writes nothing (this is the test
that fails when torch changes its private wire protocol); against servers that are not
TCPStore, stopped, or answer garbage, it refuses or gives up within its deadline."""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.agent.store.tcpstore_wire import (
    CHECK,
    MAGIC,
    PING,
    VALIDATE,
    TCPStoreReader,
    WireUnsupported,
    torch_version_supported,
)
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.core.errors import RendezvousError, StoreUnavailable

WAIT = 6  # c10d's QueryType.WAIT: a client's wait, which the readers never send

VALUES = {
    "rtrain/job/round": b"3",
    "rtrain/job/empty": b"",
    "rtrain/job/binary": bytes(range(256)) * 3,
    "rtrain/job/large": b"x" * (3 << 20),
    "rtrain/job/garbage": b"{not a number",
}


@pytest.fixture(params=[True, False], ids=["libuv", "legacy"])
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=request.param
    )
    for key, value in VALUES.items():
        store.set(key, value)
    yield store
    del store


def test_it_reads_what_torch_reads_and_writes_nothing(server: Any) -> None:
    before = server.num_keys()
    reader = TCPStoreReader.connect("127.0.0.1", server.port, 5.0)
    for key, value in VALUES.items():
        assert reader.get(key) == value == server.get(key)
        assert reader.exists(key)
    assert reader.get("rtrain/job/missing") is None
    assert not reader.exists("rtrain/job/missing")
    assert reader.counter("rtrain/job/round") == 3
    assert reader.counter("rtrain/job/missing") == 0
    with pytest.raises(RendezvousError, match="rtrain/job/garbage"):
        reader.counter("rtrain/job/garbage")
    keys = list(VALUES)
    assert reader.multi_get(keys) == list(VALUES.values())
    assert reader.multi_get([keys[0], "rtrain/job/missing", keys[2]]) == [
        VALUES[keys[0]],
        None,
        VALUES[keys[2]],
    ]
    assert reader.multi_get([]) == []
    assert server.num_keys() == before  # no read wrote a key
    assert not server.check(["rtrain/job/missing"])
    server.set("rtrain/job/round", "4")  # a later read sees a later write
    assert reader.counter("rtrain/job/round") == 4
    reader.close()


def _waiting_on(port: int, key: str) -> socket.socket:
    """A client of the store blocked in a wait on key, as an agent's notice thread is."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    sock.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, 7))
    assert struct.unpack("<I", _exactly(sock, 4))[0] == 7
    sock.sendall(_query(WAIT, key))
    return sock


def _query(kind: int, key: str) -> bytes:
    named = b"/" + key.encode()
    return bytes([kind]) + struct.pack("<QQ", 1, len(named)) + named


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the store closed the connection"
        data += chunk
    return data


def _was_woken(waiter: socket.socket) -> bool:
    """Whether the store told waiter to stop waiting. The server answers one connection
    in order: a wake-up it sent before this check comes before the check's answer."""
    waiter.sendall(_query(CHECK, "rtrain/job/never"))
    first = _exactly(waiter, 1)[0]
    if first == 1:  # the check's NOT_READY: no wake-up came first
        return False
    assert first == 0 and _exactly(waiter, 1) == b"\x01"  # STOP_WAITING, then NOT_READY
    return True


@pytest.mark.parametrize("client", ["wire", "torch"])
def test_reads_never_wake_a_client_waiting_on_an_unset_key(server: Any, client: str) -> None:
    """torch's server wakes every client waiting on a key when any client compare-sets
    it, set or not: a status read through compare-set had every agent waiting for its
    round to close take it for closed (issue 32). The readers check, then read."""
    key = "rtrain/job/r1/closed"
    reader: Any = (
        TCPStoreReader.connect("127.0.0.1", server.port, 5.0)
        if client == "wire"
        else TorchKeyValueStore(_torch_client(server), "test", 5.0, quiet_reads=True)
    )
    waiter = _waiting_on(server.port, key)
    try:
        assert not _was_woken(waiter)
        assert reader.get(key) is None and not reader.exists(key)
        assert reader.counter(key) == 0
        assert reader.multi_get([key, "rtrain/job/round"]) == [None, b"3"]
        assert not _was_woken(waiter)
        server.set(key, "membership")  # the real thing wakes it (a set gets no answer:
        end = time.monotonic() + 10  # the wake-up is sent once a read sees the key)
        while not reader.exists(key):
            assert time.monotonic() < end
            time.sleep(0.01)
        assert _was_woken(waiter)
        assert reader.get(key) == b"membership"
    finally:
        waiter.close()


def _torch_client(server: Any) -> Any:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False)


def test_nothing_listening_is_unavailable_within_the_deadline() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port} within 1s"):
            TCPStoreReader.connect("127.0.0.1", port, 1.0)
        assert time.monotonic() - started < 3.0


def _server(answer: Callable[[socket.socket], None]) -> tuple[int, Callable[[], None]]:
    """A listening socket whose every connection is handed to answer() on a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], listener.close


def test_a_stopped_store_is_unavailable_within_the_deadline() -> None:
    """The kernel accepts the connection (as for a SIGSTOPped store host); nothing
    answers the handshake."""
    held: list[socket.socket] = []
    port, close = _server(held.append)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer within 1s"):
            TCPStoreReader.connect("127.0.0.1", port, 1.0)
        assert time.monotonic() - started < 3.0
    finally:
        close()


@pytest.mark.parametrize(
    "reply",
    [b"", b"HTTP/1.1 400 Bad Request\r\n\r\n", struct.pack("<I", 12345)],
    ids=["closes", "http", "wrong-nonce"],
)
def test_a_server_that_is_not_tcpstore_is_refused(reply: bytes) -> None:
    def answer(conn: socket.socket) -> None:
        conn.recv(10)
        conn.sendall(reply)
        conn.close()

    port, close = _server(answer)
    try:
        with pytest.raises(WireUnsupported):
            TCPStoreReader.connect("127.0.0.1", port, 2.0)
    finally:
        close()


def _answering(reply: bytes) -> TCPStoreReader:
    """A reader past its handshake whose store answers its first query with `reply`,
    then sends nothing more (it reads the queries that follow until the reader closes)."""
    mine, theirs = socket.socketpair()
    mine.settimeout(2.0)

    def answer() -> None:
        theirs.recv(1 << 16)
        theirs.sendall(reply)
        theirs.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while theirs.recv(1 << 16):
                pass
        theirs.close()

    threading.Thread(target=answer, daemon=True).start()
    return TCPStoreReader(mine, "fake:1")


def test_an_oversized_answer_is_refused_before_allocating_and_ends_the_connection() -> None:
    reader = _answering(b"\x00" + struct.pack("<Q", 1 << 62))  # set; then its length
    with pytest.raises(StoreUnavailable, match="announced a 4611686018427387904-byte value"):
        reader.get("k")
    with pytest.raises(StoreUnavailable, match="announced"):  # not reused mid-answer
        reader.exists("k")


def test_a_store_that_closes_mid_answer_is_unavailable() -> None:
    reader = _answering(b"\x00" + struct.pack("<Q", 10) + b"abc")
    with pytest.raises(StoreUnavailable, match="closed the connection"):
        reader.get("k")


@settings(max_examples=200, deadline=None)
@given(reply=st.binary(max_size=64), many=st.booleans())
def test_any_answer_is_a_value_or_one_clear_error(reply: bytes, many: bool) -> None:
    reader = _answering(reply)
    try:
        found = reader.multi_get(["a", "b"]) if many else [reader.get("a")]
    except RendezvousError as exc:  # StoreUnavailable, or a garbage counter
        assert str(exc).startswith("the rendezvous store at fake:1") or "multi_get" in str(exc)
    else:
        assert all(v is None or isinstance(v, bytes) for v in found)
    finally:
        reader.close()


@pytest.mark.parametrize(
    "version, supported",
    [
        ("2.13.0+cpu", True),
        ("2.4.1", True),
        ("2.3.1", False),
        ("2.14.0", False),
        ("3.0.0", False),
        ("nightly", False),
        (None, False),
    ],
)
def test_only_torch_versions_it_was_written_against(version: str | None, supported: bool) -> None:
    def installed(name: str) -> str:
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    assert torch_version_supported(installed) is supported


def test_the_installed_torch_is_one_it_speaks_to() -> None:
    """When torch moves past TESTED_TORCH, this fails: test the protocol against the new
    torch (the tests above) and widen the range, or leave status on torch's client."""
    assert torch_version_supported()


def test_status_over_tcpstore_does_not_import_torch(server: Any) -> None:
    """The point of the module: the command's process never loads torch."""
    code = (
        "import sys\n"
        "from rtrain.cli.status import run_status\n"
        "from rtrain.core.errors import RtrainError\n"
        "try:\n"
        f"    run_status('c10d', '127.0.0.1:{server.port}', 'nojob', '', False, False, 2.0, 5.0)\n"
        "except RtrainError as exc:\n"
        "    print(type(exc).__name__)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NoJob", "False"]
