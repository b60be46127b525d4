"""TCPStoreClient: an agent's client of the job's TCPStore, without importing torch.

Every agent but the store's host only reaches the store, and torch's client for it came
with `import torch`: 1.5-2 s of CPU on a quiet machine, and 64 agents doing it at once
on 2 cores took 85 s to start against 35 s over etcd, whose agents import no torch
(issue 36). This client speaks TCPStore's wire protocol (tcpstore_wire.py holds the
connection, the handshake and what rtrain knows of that private interface) with the
surface of torch.distributed.TCPStore that TorchKeyValueStore and KeyNotices call: set,
compare_set, add, check, multi_get, delete_key, wait, num_keys and set_timeout. The server stays
torch's own, on the host; the workers import torch in their own processes.

It is used only for a torch that tcpstore_wire.torch_version_supported() accepts
(agent/store/opening.py falls back to torch's client otherwise), and
tests/unit/agent/test_tcpstore_client.py runs it against torch's real server, both
backends, beside torch's own client. Every call is bounded by the socket's timeout
(set_timeout; TorchKeyValueStore bounds it again from outside), but for wait, bounded
by its own timeout, after which it cancels the wait on the server as torch does.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Sequence

from .tcpstore_wire import TCPStoreConnection, _key, _string

# c10d's QueryType values (TCPStoreBackend.hpp) beyond the reader's.
SET, COMPARE_SET, ADD, WAIT, GETNUMKEYS, DELETE_KEY, CANCEL_WAIT = 1, 2, 4, 6, 7, 8, 12
STOP_WAITING, WAIT_CANCELED = 0, 1  # WaitResponseType


class StoreLost(ConnectionError):
    """A call on a connection that failed, as torch's client raises one: the agent's
    TorchKeyValueStore words it (lost the rendezvous store at ..., and what to do)."""


class StoreWaitTimeout(Exception):
    """A wait's timeout passed (the wait is cancelled; the connection stays usable).
    The message says "timeout", as torch's does (KeyNotices waits again on it)."""


class TCPStoreClient(TCPStoreConnection):
    def _lost(self, what: str) -> Exception:
        return StoreLost(f"the store {what}")

    def num_keys(self) -> int:
        return int(self._ask(bytes([GETNUMKEYS]), lambda: struct.unpack("<q", self._read(8))[0]))

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """The bound of every later call but wait (torch's TCPStore.set_timeout)."""
        if self._broken is None:
            self._sock.settimeout(timeout.total_seconds())

    def set(self, key: str, value: str | bytes) -> None:
        # No answer: a lost connection shows at the next call, as with torch's client.
        self._ask(bytes([SET]) + _string(_key(key)) + _string(value), lambda: None)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        query = bytes([COMPARE_SET]) + _string(_key(key)) + _string(expected) + _string(desired)
        return self._ask(query, self._value)

    def add(self, key: str, amount: int) -> int:
        query = bytes([ADD]) + _string(_key(key)) + struct.pack("<q", amount)
        return int(self._ask(query, lambda: struct.unpack("<q", self._read(8))[0]))

    def check(self, keys: Sequence[str]) -> bool:
        return self._check(list(keys))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """torch's: the server waits until every key is set (TorchKeyValueStore asks
        only for keys it knows are)."""
        return self._multi_get(list(keys))

    def delete_key(self, key: str) -> bool:
        query = bytes([DELETE_KEY]) + _string(_key(key))
        return bool(self._ask(query, lambda: struct.unpack("<q", self._read(8))[0]))

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta) -> None:
        """Returns once the server says every key is set (or, as torch's server does,
        when a client compare-sets one of them); raises StoreWaitTimeout after timeout."""
        if self._broken is not None:
            raise self._lost(self._broken)
        listed = list(keys)
        query = bytes([WAIT]) + struct.pack("<Q", len(listed))
        query += b"".join(_string(_key(k)) for k in listed)
        bound = self._sock.gettimeout()
        self._sock.settimeout(timeout.total_seconds())
        try:
            answer = self._ask(query, lambda: self._wait_answer(bound))
        finally:
            if self._broken is None:
                self._sock.settimeout(bound)
        if answer == STOP_WAITING:
            return
        if answer != WAIT_CANCELED:
            raise self._fail(f"answered a wait with {answer}")
        raise StoreWaitTimeout(
            f"timeout: {listed} not set within {timeout.total_seconds():g}s at {self.endpoint}"
        )

    def _wait_answer(self, bound: float | None) -> int:
        """STOP_WAITING, or WAIT_CANCELED when the timeout passed first and the server
        took the cancel. A STOP_WAITING that crossed the cancel comes before its
        WAIT_CANCELED: the keys were set, so it is STOP_WAITING."""
        try:
            return self._read(1)[0]
        except TimeoutError:
            pass
        self._sock.settimeout(bound)  # the cancel's answer: any call's bound
        self._sock.sendall(bytes([CANCEL_WAIT]))
        answer = self._read(1)[0]
        if answer == STOP_WAITING and self._read(1)[0] != WAIT_CANCELED:
            raise self._fail("did not answer a wait's cancel")
        return answer
