"""TorchKeyValueStore, the typed store seam, over torch's real HashStore; and what it
makes of a store that fails, stops answering, or holds garbage."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from rtrain.agent.store.kv import KeyValueStore, increment, wrote
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.core.errors import RendezvousError, StoreUnavailable

from .fakes import FaultyStore, memory_store


def test_the_torch_store_keeps_the_contract() -> None:
    store = memory_store()
    assert isinstance(store, KeyValueStore)
    keeps_the_contract(store)


def keeps_the_contract(store: KeyValueStore) -> None:
    """The seam's calls on a fresh store, each answered as the seam promises (also run
    over rtrain's TCPStore wire client, test_tcpstore_client)."""
    assert store.get("k") is None and not store.exists("k")
    store.set("k", "v")
    assert store.get("k") == b"v" and store.exists("k")
    assert store.set_once("once", "a") == b"a"
    assert store.set_once("once", "b") == b"a"
    assert wrote(store, "w", "x") and not wrote(store, "w", "y")
    assert store.compare_set("k", "v", "v2") == b"v2"
    assert store.compare_set("k", "wrong", "v3") == b"v2"
    assert store.add("n", 3) == 3 and increment(store, "n") == 4 and store.counter("n") == 4
    assert store.counter("unset") == 0
    assert store.multi_get(["k", "n", "missing"]) == [b"v2", b"4", None]
    assert store.multi_get(["k", "n"]) == [b"v2", b"4"]
    assert store.wait(["k"], 0.0) and not store.wait(["missing"], 0.0)
    assert store.delete("k") and store.get("k") is None


def test_garbage_where_a_counter_should_be_is_refused() -> None:
    store = memory_store()
    store.set("joins", "not a number")
    with pytest.raises(RendezvousError, match="refusing the job's state"):
        store.counter("joins")
    with pytest.raises(RendezvousError):
        increment(store, "joins")  # never an add on garbage: the real store would hang up


class _Raising:
    """A torch store whose calls fail with a given exception."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def check(self, keys: list[str]) -> bool:
        raise self.exc

    def set(self, key: str, value: str) -> None:
        raise self.exc


@pytest.mark.parametrize("exc", [RuntimeError(""), RuntimeError("\n\n"), OSError()])
def test_a_store_error_without_a_message_is_a_lost_store(exc: Exception) -> None:
    # Before: str(exc).splitlines()[0] raised IndexError out of the agent.
    store = TorchKeyValueStore(_Raising(exc), "h:1")
    with pytest.raises(StoreUnavailable, match=r"lost the rendezvous store at h:1 \("):
        store.exists("k")


def test_a_store_that_stops_answering_fails_every_later_call_at_once() -> None:
    release = threading.Event()

    class Stuck:
        def check(self, keys: list[str]) -> bool:
            release.wait(30)
            return True

    store = TorchKeyValueStore(Stuck(), "h:2", deadline_s=0.05)
    try:
        with pytest.raises(StoreUnavailable, match="stopped answering"):
            store.exists("k")
        with pytest.raises(StoreUnavailable, match="stopped answering"):
            store.set("k", "v")  # not queued behind the stuck call
    finally:
        release.set()


def test_the_fault_injector_stops_after_the_calls_it_was_given() -> None:
    store = FaultyStore(TorchKeyValueStore(dist.HashStore(), "memory"))
    store.fail_after(2)
    store.set("a", "1")
    assert store.get("a") == b"1"
    with pytest.raises(StoreUnavailable):
        store.exists("a")
    assert store.calls == {"set": 1, "get": 1, "exists": 1}


def test_a_taken_port_is_told_by_errno_not_by_message_text() -> None:
    import socket

    from rtrain.agent.store.opening import port_taken

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        assert port_taken(port)
    finally:
        listener.close()
    assert not port_taken(port) and not port_taken(0)


class _CountedCalls:
    """A torch store that counts the calls made of it."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, op: str) -> object:
        method = getattr(self.store, op)

        def counted(*args: object) -> object:
            self.calls.append(op)
            return method(*args)

        return counted


def test_a_multi_get_of_keys_seen_set_is_one_round_trip() -> None:
    inner = _CountedCalls(dist.HashStore())
    store = TorchKeyValueStore(inner, "memory")
    store.set("lease/1", "1")
    assert store.multi_get(["lease/1", "lease/2"]) == [b"1", None]  # one not set: per key
    store.set("lease/2", "1")
    inner.calls.clear()
    assert store.multi_get(["lease/1", "lease/2"]) == [b"1", b"1"]
    assert inner.calls == ["check", "multi_get"]  # checked once
    inner.calls.clear()
    for _ in range(3):
        store.set("lease/1", "2")
        assert store.multi_get(["lease/1", "lease/2"]) == [b"2", b"1"]
    assert inner.calls == ["set", "multi_get"] * 3  # known set: no check
    store.delete("lease/2")
    assert store.multi_get(["lease/1", "lease/2"]) == [b"2", None]  # never a blocking read
