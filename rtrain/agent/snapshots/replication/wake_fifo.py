"""The generation's wake FIFO (WAKE_FIFO in its slot folder): each worker writes a byte
into it after it commits a snapshot, so the replicator's thread takes the snapshot at
once rather than at its next poll (which backs off to IDLE_POLL_S while idle, longer
than a fast step). Opened for reading and writing, so that it never reads as closed
between workers. Without it, the replicator polls as before.

Descriptor ownership, the reason this is a class: a new generation's FIFO is opened
by the agent's main thread while the replicating thread may be about to select on or
read the old one. The old descriptor is therefore retired, not closed, and closed by
the reading thread at its next wait. Closed at once, its number went to the next
socket the agent opened, the new generation's worker store accepting a worker, and
the reading thread read that worker's store request off it: the worker waited in
init_process_group for an answer forever (tests/unit/agent/test_replicator_wake.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading

from ....core.snapshots.format import WAKE_FIFO

logger = logging.getLogger(__name__)


class WakeFifo:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None  # this generation's, read end
        self._retired: list[int] = []  # earlier generations', closed by wait()

    def follow(self, folder: str | None) -> None:
        """The FIFO of the generation whose slots are in `folder` (None: none). Any
        thread; the old descriptor's waiter is woken and closes it."""
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.write(self._fd, b"\0")  # a select on it ends now
                self._retired.append(self._fd)
                self._fd = None
            if folder is None:
                return
            path = os.path.join(folder, WAKE_FIFO)
            try:
                if not os.path.exists(path):
                    os.mkfifo(path, 0o600)
                self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
            except OSError as exc:
                logger.debug("no wake FIFO at %s (%s): polling", path, exc)

    def wait(self, pause: float, closed: threading.Event) -> None:
        """Until a worker's byte, `pause` seconds, or `closed`. From the one reading
        thread only: the only place a descriptor is closed while it runs."""
        with self._lock:
            self._close_retired()
            fd = self._fd
        if fd is None:
            closed.wait(pause)
            return
        try:
            if select.select([fd], [], [], pause)[0]:
                os.read(fd, 4096)
        except OSError:  # a FIFO that fails: the next pass polls
            closed.wait(pause)

    def close(self) -> None:
        """Once the reading thread is gone."""
        self.follow(None)
        with self._lock:
            self._close_retired()

    def _close_retired(self) -> None:
        while self._retired:
            os.close(self._retired.pop())
