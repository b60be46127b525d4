"""SparePool: shared memory written before a failure, for a restore to receive into.

A shard fetched from a peer into fresh shared memory pays a page fault for every page
as the stream arrives (fresh memory faults in at about 1 GB/s on a VM whose host backs
guest memory lazily), so a restore from a peer ran at a fraction of a loopback stream.
The pool keeps a few spare files under <root>/pool, each written once and kept mapped:
a restore takes one (renamed to the new worker's slot, its header wiped) and the
stream lands in memory whose pages are already there.

How much: one spare per local rank, each as large as the largest shard this node's
workers committed, within what the --snapshot-memory budget leaves free (the spares
count toward it, and are the first memory to go when a replica needs room). The
service tops the pool up after a generation's first commit, on a thread of its own;
a restore that finds no spare that fits (failures in a row, faster than it refills,
or a node that never committed) receives into fresh memory, and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import mmap
import os
import threading
from collections.abc import Callable

from ...core.snapshots.format import HEADER_SIZE

logger = logging.getLogger(__name__)

PAGE_RUN = 1 << 22  # bytes written at a time while a spare is faulted in


class SparePool:
    def __init__(self, folder: str, allocate: Callable[[str, int], mmap.mmap]) -> None:
        """allocate(path, size): a new file of that size, mapped (the store's)."""
        self.folder = folder
        self._allocate = allocate
        self._spares: list[tuple[int, str, mmap.mmap]] = []  # (capacity, path, mapping)
        self._names = itertools.count()
        self._lock = threading.Lock()
        self.wanted = False  # topped up at least once: an empty pool is then news
        os.makedirs(folder, exist_ok=True)

    def held_bytes(self) -> int:
        with self._lock:
            return sum(capacity for capacity, _, _ in self._spares)

    def count(self, size: int = 0) -> int:
        """How many spares hold at least `size` bytes."""
        with self._lock:
            return sum(1 for capacity, _, _ in self._spares if capacity >= size)

    def top_up(self, count: int, size: int, room: int) -> int:
        """Add spares of `size` bytes, each written once, until `count` of at least that
        size are held, using at most `room` bytes; how many were added. Spares smaller
        than `size` (the shards grew) are let go first."""
        self.wanted = True
        self._let_go(lambda capacity: capacity < size)
        added = 0
        while self.count(size) < count and room >= size > 0:
            path = os.path.join(self.folder, f"spare{next(self._names)}")
            try:
                mapping = self._allocate(path, size)
            except (OSError, RuntimeError) as exc:  # /dev/shm is short: fewer spares
                logger.warning("no spare slot for restores: %s", exc)
                break
            _fault_in(mapping)
            with self._lock:
                self._spares.append((size, path, mapping))
            room -= size
            added += 1
        return added

    def take(self, path: str, size: int) -> mmap.mmap | None:
        """The smallest spare of at least `size` bytes, moved to `path` with its header
        wiped, and its mapping (already faulted in); None when none fits."""
        with self._lock:
            fitting = [spare for spare in self._spares if spare[0] >= size]
            if not fitting:
                return None
            chosen = min(fitting, key=lambda spare: spare[0])
            self._spares.remove(chosen)
        _, spare_path, mapping = chosen
        try:
            mapping[:HEADER_SIZE] = bytes(HEADER_SIZE)  # never mistaken for a snapshot
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            os.rename(spare_path, path)
        except OSError:
            mapping.close()
            with contextlib.suppress(OSError):
                os.remove(spare_path)
            raise
        return mapping

    def release(self, need: int) -> int:
        """Let spares go until `need` bytes are freed (or none is left); bytes freed."""
        freed = 0

        def enough(capacity: int) -> bool:
            nonlocal freed
            if freed >= need:
                return False
            freed += capacity
            return True

        self._let_go(enough)
        return freed

    def close(self) -> None:
        self._let_go(lambda capacity: True)

    def _let_go(self, which: Callable[[int], bool]) -> None:
        with self._lock:
            going = [spare for spare in self._spares if which(spare[0])]
            self._spares = [spare for spare in self._spares if spare not in going]
        for _, path, mapping in going:
            mapping.close()
            with contextlib.suppress(OSError):
                os.remove(path)


def _fault_in(mapping: mmap.mmap) -> None:
    """Write every page once, so that a restore finds them mapped; a run of pages at a
    time through ctypes.memset, which releases the GIL while it writes."""
    view = (ctypes.c_char * len(mapping)).from_buffer(mapping)
    try:
        base = ctypes.addressof(view)
        for start in range(0, len(mapping), PAGE_RUN):
            ctypes.memset(base + start, 0, min(PAGE_RUN, len(mapping) - start))
    finally:
        del view  # the mapping can be closed again


class SpareFiller:
    """Tops the pool up on a thread of its own when asked (after a generation's first
    commit): never on the step's or the restore's path. Its pages are written with
    the GIL released, and at the agent's own priority: a thread at a lower one that
    the kernel left waiting while it held the GIL would stall the agent's other
    threads (replication, its lease) on a loaded node."""

    def __init__(self, pool: SparePool, sizing: Callable[[], tuple[int, int, int]]) -> None:
        """sizing(): (spares wanted, bytes each, bytes of the budget free for them)."""
        self._pool = pool
        self._sizing = sizing
        self._asked = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.rounds = 0  # top-ups done, for tests

    def ask(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rtrain-spares", daemon=True)
            self._thread.start()
        self._asked.set()

    def close(self) -> None:
        self._closed = True
        self._asked.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self._pool.close()

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._closed:
                return
            try:
                count, size, room = self._sizing()
                added = self._pool.top_up(count, size, room)
            except Exception:  # a spare is an optimisation: never the agent's end
                logger.exception("topping up the spare slots")
                continue
            self.rounds += 1
            if added:
                logger.debug("%d spare slots of %.1f MiB ready for restores", added, size / 2**20)
