"""StoreCalls: the agent's calls to the rendezvous store, with one error for a lost store.

Every failure of the store itself becomes one clear RendezvousError; every value read
back as a number is validated, so garbage under the job's keys is refused, not trusted.

Every call is bounded. TCPStore's client waits for ever for the answer to a check,
set or add when the server's process is stopped (SIGSTOP, a frozen VM): its timeout
covers only waits for keys. So calls run on one helper thread and the caller waits at
most the deadline (--rdzv-conf read_timeout); a store that did not answer in time is
treated as lost from then on, like one whose host died.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any

from ...core.errors import RendezvousError
from ...core.rendezvous.protocol import ProtocolError, decode_int


def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


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


class StoreCalls:
    def __init__(self, store: Any, endpoint: str, deadline_s: float | None = None) -> None:
        """deadline_s: the longest a call may take; None calls the store directly."""
        self._store = store
        self._endpoint = endpoint
        self._deadline_s = deadline_s
        self._thread = _CallThread() if deadline_s else None
        self._unanswered: str | None = None

    def call(self, op: str, *args: Any) -> Any:
        if self._unanswered is not None:
            raise RendezvousError(self._unanswered)
        try:
            if self._thread is None:
                return getattr(self._store, op)(*args)
            future = self._thread.submit(getattr(self._store, op), *args)
            try:
                return future.result(timeout=self._deadline_s)
            except TimeoutError:
                self._unanswered = (
                    f"the rendezvous store at {self._endpoint} stopped answering: no reply to "
                    f"{op} within read_timeout={self._deadline_s:g}s (its host is stopped, "
                    "frozen or cut off)"
                )
                raise RendezvousError(self._unanswered) from None
        except RendezvousError:
            raise
        except Exception as exc:
            raise RendezvousError(
                f"lost the rendezvous store at {self._endpoint} "
                f"({str(exc).splitlines()[0][:120]}); "
                "if its host node died, restart the job with a reachable --rdzv-endpoint"
            ) from None

    def exists(self, key: str) -> bool:
        return bool(self.call("check", [key]))

    def increment(self, key: str) -> int:
        """add(key, 1), after checking the key holds a number: the store answers an add on
        anything else by dropping the connection, which would read as a lost store."""
        self.counter(key)
        return int(self.call("add", key, 1))

    def counter(self, key: str) -> int:
        # get, not add(key, 0): the store drops the connection of an add on a value that
        # is not an integer, and garbage must be refused with a clear error instead.
        if not self.exists(key):
            return 0
        try:
            return decode_int(self.call("get", key), key)
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's state in the store: {exc}") from None

    def set_once(self, key: str, value: str) -> bool:
        """compare_set from empty: True if this call wrote `value`."""
        return text_of(self.call("compare_set", key, "", value)) == value
