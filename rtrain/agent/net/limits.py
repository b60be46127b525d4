"""Caps on a server's connections, and a warning log that cannot be flooded.

A server on the job's address (the shard server, --metrics-port) can be reached by
anyone on the network. Each connection costs a descriptor and, on a threaded server, a
thread; without a cap a few hundred idle clients exhaust the agent's descriptors and the
next file it opens (a generation's topology.json) fails. So a connection is judged
before a thread exists: one place per connection, a few per source address and a bound
in all, and one that finds no place is closed at once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from ...core.clock import Clock
from ..waiting import SYSTEM_CLOCK

LOG_EVERY_S = 60.0


class RateLimitedLog:
    """One warning per kind of event per LOG_EVERY_S, with the count since the last;
    each kind has its own allowance, so one noisy kind never hides another."""

    def __init__(
        self, logger: logging.Logger, every_s: float = LOG_EVERY_S, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._logger = logger
        self._clock = clock
        self._every_s = every_s
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = self._clock.now()
        with self._lock:
            last, skipped = self._last.get(kind, (-self._every_s, 0))
            if now - last < self._every_s:
                self._last[kind] = (last, skipped + 1)
                return
            self._last[kind] = (now, 0)
        more = f" ({skipped} more like it since the last report)" if skipped else ""
        self._logger.warning(message + more, *args)


class ConnectionPlaces:
    """Places for connections: at most per_source from one address, total in all."""

    def __init__(self, per_source: int, total: int) -> None:
        self.per_source = per_source
        self.total = total
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, source: str) -> bool:
        """A place for a connection from source, or False when none is left."""
        with self._lock:
            if self._held[source] >= self.per_source:
                return False
            if sum(self._held.values()) >= self.total:
                return False
            self._held[source] += 1
            return True

    def free(self, source: str) -> None:
        with self._lock:
            self._held[source] -= 1
            if self._held[source] <= 0:
                del self._held[source]

    def held(self, source: str | None = None) -> int:
        """Places held by source, or by everyone."""
        with self._lock:
            return self._held[source] if source is not None else sum(self._held.values())
