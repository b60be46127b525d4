"""KeyNotices: whether a key has been set, learnt from TCPStore's blocking wait.

A key that is written once and then checked many times a second by every agent (the
closed membership of a round, a generation's news) costs a request per check when it
is polled: at 2,048 agents polling every 0.25 s that is 8,000 requests a second for
an answer that changes once. Here one daemon thread per agent blocks in
TCPStore.wait on a connection of its own, so a check is a look at a set in memory.

The thread serves one key at a time, the newest asked for. While it is still blocked
on an older key (which only happens when a key is asked for before the previous one
was set), or when its connection failed, a check falls back to the caller's own read:
slower, never wrong. The wait has no deadline of its own (a long one, so that its
timeout, which torch logs, is all but never reached); the key being set, the store
going away or the process ending is what ends it.

A wait's return is not "set": torch's server wakes every client waiting on a key
whenever any client compare-sets it, also when the key is missing and nothing is
written (a read through compare_set with a sentinel, as `rtrain status` read once).
So the thread confirms the key with a check on its own connection before it counts
it as set, and waits again when it is not (issue 32: a status request in an open
round had every waiting agent take the round for closed).
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from ...core.errors import first_line

logger = logging.getLogger(__name__)

# The wait's own deadline: reached only by a key that is never set in a day.
WAIT_TIMEOUT = datetime.timedelta(days=1)
REMEMBERED = 64  # keys found set; older ones are read from the store again


class KeyNotices:
    def __init__(self, connect: Callable[[], Any], endpoint: str) -> None:
        """connect: opens a torch Store connection of its own (called on the thread)."""
        self._connect = connect
        self._endpoint = endpoint
        self._lock = threading.Condition()
        self._wanted: str | None = None
        self._waiting_on: str | None = None
        self._seen: dict[str, None] = {}  # insertion-ordered set
        self._broken = False
        self.spurious_wakeups = 0  # waits that returned on a key still unset
        # Connected now, with the agent's other connections: TCPStore's server looks up
        # each new client's name, and on a host without DNS that stalls every client
        # for the resolver's timeout, which must not happen once leases are renewed.
        self._thread = threading.Thread(target=self._run, name="rtrain-store-wait", daemon=True)
        self._thread.start()

    def check(self, key: str, read: Callable[[], bool]) -> bool:
        """Whether key is set: from the waiting thread when it waits on key, else read()."""
        with self._lock:
            if key in self._seen:
                return True
            if not self._broken and self._waiting_on == key:
                return False
            if not self._broken and self._wanted != key:
                self._wanted = key
                self._lock.notify()
        if read():
            self._remember(key)
            return True
        return False

    @property
    def waiting_on(self) -> str | None:
        """The key the thread is blocked on now (for tests and diagnostics)."""
        with self._lock:
            return self._waiting_on

    def _remember(self, key: str) -> None:
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > REMEMBERED:
                del self._seen[next(iter(self._seen))]

    def _run(self) -> None:
        try:
            store = self._connect()
        except Exception as exc:
            self._give_up(f"cannot open a connection to wait on ({first_line(exc, 120)})")
            return
        while True:
            with self._lock:
                while self._wanted is None or self._wanted in self._seen:
                    self._waiting_on = None
                    self._lock.wait()
                key = self._waiting_on = self._wanted
            try:
                store.wait([key], WAIT_TIMEOUT)
                confirmed = bool(store.check([key]))
            except Exception as exc:
                if "timeout" in str(exc).lower():
                    continue
                self._give_up(first_line(exc, 120))
                return
            if confirmed:
                self._remember(key)
            else:  # woken by a compare-set that wrote nothing: wait again
                with self._lock:
                    self.spurious_wakeups += 1

    def _give_up(self, why: str) -> None:
        # The agent's own reads find a lost store and say so; this only stops helping.
        logger.info("waiting on %s stopped (%s); polling instead", self._endpoint, why)
        with self._lock:
            self._broken = True
            self._waiting_on = None
