"""TorchKeyValueStore: KeyValueStore over a torch.distributed Store (TCPStore, HashStore).

Every failure of the store itself becomes one StoreUnavailable; every value read back
as a number is validated, so garbage under the job's keys is refused, not trusted.

Every call is bounded. TCPStore's client waits for ever for the answer to a check,
set or add when the server's process is stopped (SIGSTOP, a frozen VM): its timeout
covers only waits for keys. So calls run on one helper thread and the caller waits at
most the deadline (--rdzv-conf read_timeout); a store that did not answer in time is
treated as unavailable from then on, like one whose host died.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ...core.clock import Clock
from ...core.errors import RendezvousError, StoreUnavailable, first_line
from ..waiting import SYSTEM_CLOCK
from .kv import as_bytes, decode_counter
from .torch_notices import KeyNotices

POLL_S = 0.02
# compare_set(key, UNSET, UNSET) reads key in one round trip and never writes: the store
# answers a missing key with the expected value (UNSET) and a set one with its value. A
# plain get would block on a missing key, so it took a check first: two round trips.
UNSET = b"\x00rtrain:unset\x00"
KNOWN_SET_KEYS = 4096  # keys multi_get remembers as set, before it starts over


class _CallThread:
    """Runs calls one at a time on a daemon thread, so that one stuck for ever in C
    does not keep the agent from exiting."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Any, tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="rtrain-store-calls", daemon=True).start()

    def submit(self, function: Any, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, function, args))
        return future

    def _run(self) -> None:
        while True:
            future, function, args = self._calls.get()
            try:
                future.set_result(function(*args))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


class TorchKeyValueStore:
    def __init__(
        self,
        store: Any,
        endpoint: str,
        deadline_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        connect: Callable[[], Any] | None = None,
        quiet_reads: bool = False,
    ) -> None:
        """store: a torch.distributed Store; deadline_s: the longest a call may take
        (None: called directly, for in-process stores); connect: opens another
        connection to the same store, on which notice() waits (None: notice() polls);
        quiet_reads: get checks a key before reading it and sends no compare-set, which
        wakes every client waiting on the key, set or not (for a reader from outside the
        job: `rtrain status` over torch's client)."""
        self._quiet_reads = quiet_reads
        self.endpoint = endpoint
        self._store = store
        self._deadline_s = deadline_s
        self._thread = _CallThread() if deadline_s else None
        self._unanswered: str | None = None
        self._clock = clock
        self._notices = KeyNotices(connect, endpoint) if connect is not None else None
        self._known: set[str] = set()  # keys seen set (multi_get)

    def _call(self, op: str, *args: Any) -> Any:
        if self._unanswered is not None:
            raise StoreUnavailable(self._unanswered)
        try:
            if self._thread is None:
                return getattr(self._store, op)(*args)
            future = self._thread.submit(getattr(self._store, op), *args)
            try:
                return future.result(timeout=self._deadline_s)
            except TimeoutError:
                self._unanswered = (
                    f"the rendezvous store at {self.endpoint} stopped answering: no reply to "
                    f"{op} within read_timeout={self._deadline_s:g}s (its host is stopped, "
                    "frozen or cut off)"
                )
                raise StoreUnavailable(self._unanswered) from None
        except RendezvousError:
            raise
        except Exception as exc:
            raise StoreUnavailable(
                f"lost the rendezvous store at {self.endpoint} ({first_line(exc, 120)}); "
                "if its host node died, restart the job with a reachable --rdzv-endpoint"
            ) from None

    def get(self, key: str) -> bytes | None:
        if self._quiet_reads:
            if not self._call("check", [key]):
                return None
            return as_bytes(self._call("multi_get", [key])[0])
        value = as_bytes(self._call("compare_set", key, UNSET, UNSET))
        return None if value == UNSET else value

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", key, value)

    def exists(self, key: str) -> bool:
        return bool(self._call("check", [key]))

    def set_once(self, key: str, value: str | bytes) -> bytes:
        return self.compare_set(key, "", value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return as_bytes(self._call("compare_set", key, expected, desired))

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, amount))

    def counter(self, key: str) -> int:
        # get, not add(key, 0): the store drops the connection of an add on a value that
        # is not an integer, and garbage must be refused with a clear error instead.
        return decode_counter(self.get(key), key)

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        # TCPStore's multi_get blocks on a key that is not set, so it is asked only for
        # keys known to be set: seen set by this client before (rtrain never deletes a
        # key), or checked now. A lease watch reads the same few keys every half
        # interval: one round trip each time, not two.
        listed = list(keys)
        if listed and (self._known.issuperset(listed) or self._call("check", listed)):
            values: list[bytes | None] = [as_bytes(v) for v in self._call("multi_get", listed)]
            self._remember_set(listed)
            return values
        return [self.get(key) for key in keys]

    def _remember_set(self, keys: list[str]) -> None:
        if len(self._known) + len(keys) > KNOWN_SET_KEYS:
            self._known.clear()
        self._known.update(keys)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        listed = list(keys)
        return self._clock.wait_until(lambda: bool(self._call("check", listed)), timeout, POLL_S)

    def delete(self, key: str) -> bool:
        self._known.discard(key)
        return bool(self._call("delete_key", key))

    def follow(self, key: str) -> Callable[[], bytes | None]:
        return functools.partial(self.get, key)

    def notice(self, key: str) -> Callable[[], bool]:
        read = functools.partial(self.exists, key)
        notices = self._notices
        if notices is None:
            return read

        def check() -> bool:
            if self._unanswered is not None:
                raise StoreUnavailable(self._unanswered)
            return notices.check(key, read)

        return check
