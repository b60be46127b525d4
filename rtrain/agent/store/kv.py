"""KeyValueStore: the one interface through which the agent uses the rendezvous store.

Every agent module goes through it; nothing outside agent/store names a backend's
operations. It is implemented over torch's TCPStore (torch_store.py) and over etcd
(etcd/store.py), and tests wrap it in a store that injects faults.

The contract every implementation keeps:
- values are bytes; str values are written as UTF-8;
- no call blocks longer than the store's own deadline; a store that is gone, stopped
  or cut off raises StoreUnavailable (a RendezvousError, exit 75), never hangs;
- counter and increment refuse a value that is not a decimal integer with a
  RendezvousError: garbage under the job's keys is refused, not trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ...core.errors import RendezvousError
from ...core.rendezvous.protocol import ProtocolError, decode_int


@runtime_checkable
class KeyValueStore(Protocol):
    endpoint: str  # where the store is, for error messages

    def get(self, key: str) -> bytes | None:
        """The value of key, or None if it is not set."""
        ...

    def set(self, key: str, value: str | bytes) -> None: ...

    def exists(self, key: str) -> bool: ...

    def set_once(self, key: str, value: str | bytes) -> bytes:
        """Write value unless key is already set; the value key holds afterwards (value
        itself for the one caller whose write took)."""
        ...

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """Write desired if key holds expected (an empty expected: if key is unset); the
        value key holds afterwards."""
        ...

    def add(self, key: str, amount: int) -> int:
        """Add amount to the integer under key (unset reads as 0); the new value."""
        ...

    def counter(self, key: str) -> int:
        """The integer under key, 0 if unset."""
        ...

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """get for each key, in one round trip where the backend can."""
        ...

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Whether every key is set within timeout seconds (polls: a blocking wait would
        keep the agent from its signals)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove key; whether it was there."""
        ...

    def follow(self, key: str) -> Callable[[], bytes | None]:
        """A reader of key's latest value, for what is checked many times a second: a
        watch where the backend has them (no store traffic per read), else a get."""
        ...

    def notice(self, key: str) -> Callable[[], bool]:
        """A check of whether key is set, for a key written once and checked many times a
        second: answered from a blocking wait on a connection of its own (TCPStore) or a
        watch (etcd), so that a check costs no request while the key stays unset."""
        ...


def increment(store: KeyValueStore, key: str) -> int:
    """add(key, 1) after checking the key holds a number (counter raises otherwise)."""
    store.counter(key)
    return store.add(key, 1)


def wrote(store: KeyValueStore, key: str, value: str | bytes) -> bool:
    """set_once, as: did this call's write take?"""
    return store.set_once(key, value) == as_bytes(value)


def decode_counter(payload: bytes | None, what: str) -> int:
    """A counter's value as the store holds it (unset: 0); garbage is a RendezvousError."""
    if payload is None:
        return 0
    try:
        return decode_int(payload, what)
    except ProtocolError as exc:
        raise RendezvousError(f"refusing the job's state in the store: {exc}") from None


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
