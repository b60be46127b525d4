"""ShardStore: the shards this node keeps in shared memory, owned by the agent.

  <root>/snap/gen<G>/rank<R>.slot<0|1|2> the workers' own slots (they write, we read)
  <root>/snap/gen<G>/rank<R>.spare       a recycled file a worker may swap in for a slot
  <root>/replica/g<G>_r<R>.rep<0|1>       peers' shards kept here, newest two steps each
                                         (.rep2 and on: while puts of one rank overlap)
  <root>/pool/spare<N>                    memory written once, for restores (spare_pool.py)

<root> is on /dev/shm, so everything here is memory, and it outlives the workers:
a restarted worker finds its state here. Space is reserved with posix_fallocate, so a
full /dev/shm or a full --snapshot-memory budget is a clear error, never a SIGBUS.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import mmap
import os
import re
import shutil
import threading
from collections.abc import Iterator
from typing import Any

from ...core.snapshots.format import (
    COMMITTED,
    HEADER_SIZE,
    SLOTS_PER_RANK,
    ShardHeader,
    read_header,
)
from ...core.snapshots.restore_plan import ShardId, Written
from ..runtime_dir import make_folder, no_space
from .checksums import checksums
from .slot_check import fitting_header
from .spare_pool import SparePool

logger = logging.getLogger(__name__)

SLOT = re.compile(r"gen(\d+)/rank(\d+)\.slot\d$")
REPLICA = re.compile(r"g(\d+)_r(\d+)\.rep\d+$")
KEEP_STEPS = 2


class ShardStore:
    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self._crcs: dict[ShardId, list[int]] = {}
        self._replicas: dict[ShardId, tuple[str, int]] = {}  # complete ones: path, size
        self._receiving: set[str] = set()  # replica files being written now
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()
        os.makedirs(os.path.join(root, "snap"), exist_ok=True)
        os.makedirs(os.path.join(root, "replica"), exist_ok=True)
        self.pool = SparePool(os.path.join(root, "pool"), allocate)

    def snap_dir(self, generation: int) -> str:
        path = os.path.join(self.root, "snap", f"gen{generation}")
        make_folder(path, "this generation's snapshot slots")
        return path

    # -- what is here --

    def local_slots(self) -> list[tuple[ShardId, str]]:
        found = []
        for path in glob.glob(os.path.join(self.root, "snap", "gen*", "rank*.slot*")):
            match = SLOT.search(path)
            header = _header_of(path)
            if match and header is not None and header.state == COMMITTED:
                found.append((ShardId(int(match[1]), int(match[2]), header.step), path))
        return found

    def replicas(self) -> list[tuple[ShardId, str]]:
        """Complete replicas only: one being received (or cut off) is not listed."""
        with self._lock:
            return [(shard, path) for shard, (path, _) in self._replicas.items()]

    def replica_steps(self, generation: int, rank: int) -> list[int]:
        with self._lock:
            return [s.step for s in self._replicas if (s.generation, s.rank) == (generation, rank)]

    def inventory(self) -> list[ShardId]:
        return sorted({shard for shard, _ in self.local_slots() + self.replicas()}, key=str)

    def largest_slot(self, generation: int | None) -> int:
        """The size of the largest shard this node's workers committed in `generation`."""
        sizes = [0]
        for shard, path in self.local_slots():
            header = _header_of(path) if shard.generation == generation else None
            sizes.append(header.size if header is not None else 0)
        return max(sizes)

    def used_bytes(self) -> int:
        paths = glob.glob(os.path.join(self.root, "snap", "gen*", "*"))
        paths += glob.glob(os.path.join(self.root, "replica", "*"))
        return sum(_size(p) for p in paths) + self.pool.held_bytes()

    # -- checksums --

    def remember_crcs(self, shard: ShardId, crcs: list[int]) -> None:
        with self._lock:
            self._crcs[shard] = crcs

    def open_shard(self, shard: ShardId) -> tuple[Any, int, list[int]] | None:
        """A read-only mapping of a shard held here, its size and its checksums. Its
        header is checked against what holds it (a replica's listed size, a slot's
        file) before its size is used: one that does not fit is not opened."""
        with self._lock:
            listed = self._replicas.get(shard)
        held: list[tuple[str, int | None]] = [listed] if listed is not None else []
        held += [(path, None) for known, path in self.local_slots() if known == shard]
        for path, size in held:
            # A replica's own mapping, kept from its receipt, whose pages are mapped
            # already: mapping the file again paid a page fault per page on every get
            # (3x the CPU of reading it: 0.10 against 0.035 s for 500 MB here).
            buffer = self._maps.get(path) if size is not None else None
            buffer = buffer if buffer is not None else _map(path, writable=False)
            head = bytes(buffer[:HEADER_SIZE])
            header = read_header(head)
            if header is None or header.step != shard.step:
                continue  # a slot the worker is overwriting right now
            length = len(buffer) if size is None else min(size, len(buffer))
            if fitting_header(head, length, path) is None:
                continue  # not committed, or corrupt
            with self._lock:
                crcs = self._crcs.get(shard)
            if crcs is None:
                crcs = checksums(buffer, header.size)
                self.remember_crcs(shard, crcs)
            return buffer, header.size, crcs
        return None

    # -- receiving --

    @contextlib.contextmanager
    def receive(self, shard: ShardId, size: int) -> Iterator[tuple[str, Any]]:
        """(its file, a writable buffer) for an incoming replica, within the memory budget.

        Each (generation, rank) has two replica files used in turn, kept mapped, so in
        steady state a replica lands in memory that is already allocated and faulted in.
        A file is written by one receipt at a time: puts of one rank that overlap (a
        forged one, a confused peer's) each get their own, never the other's.
        """
        path = self._replica_target(shard)
        try:
            buffer = self._maps.get(path)
            if buffer is None or len(buffer) < size:
                grow = size - (len(buffer) if buffer is not None else 0)
                over = self.used_bytes() + grow - self.budget if self.budget else 0
                if over > 0 and self.pool.release(over) < over:  # spares go first
                    raise OSError(f"replica of {size} bytes would exceed --snapshot-memory")
                if buffer is not None:
                    with contextlib.suppress(BufferError):  # a get still sends from it
                        buffer.close()
                buffer = allocate(path, size)
                self._maps[path] = buffer
            yield path, buffer
        finally:
            with self._lock:
                self._receiving.discard(path)

    def keep_replica(self, shard: ShardId, path: str, size: int, crcs: list[int]) -> None:
        """List a replica received whole into `path` (from receive); the newest
        KEEP_STEPS of its rank stay listed."""
        with self._lock:
            self._replicas[shard] = (path, size)
            for older in self._same_rank(shard)[:-KEEP_STEPS]:
                del self._replicas[older]
        self.remember_crcs(shard, crcs)

    def forget_replicas(self, generation: int, rank: int, steps: list[int]) -> None:
        """Stop listing these replicas of (generation, rank); their files are reused."""
        with self._lock:
            for step in steps:
                shard = ShardId(generation, rank, step)
                self._replicas.pop(shard, None)
                self._crcs.pop(shard, None)

    def _same_rank(self, shard: ShardId) -> list[ShardId]:
        """The replicas listed of shard's (generation, rank), oldest first (lock held)."""
        key = (shard.generation, shard.rank)
        return sorted(
            (s for s in self._replicas if (s.generation, s.rank) == key), key=lambda s: s.step
        )

    def _replica_target(self, shard: ShardId) -> str:
        """A replica file of (generation, rank) for an incoming replica, reserved for it
        until its receipt ends: the step's own file when it is sent again, else the
        older of the two once it is no longer listed; never one listed or being written."""
        with self._lock:
            again = self._replicas.pop(shard, None)  # rewritten: no longer listed
            same = self._same_rank(shard)
            while len(same) >= KEEP_STEPS:
                del self._replicas[same.pop(0)]
            taken = {self._replicas[s][0] for s in same} | self._receiving
            base = os.path.join(self.root, "replica", f"g{shard.generation}_r{shard.rank}")
            names = (f"{base}.rep{i}" for i in itertools.count())
            path = again[0] if again and again[0] not in taken else None
            path = path or next(p for p in names if p not in taken)
            self._receiving.add(path)
            return path

    def restore_target(self, generation: int, rank: int, size: int) -> Any:
        """The new worker's slot 0, for a restored shard of `size` bytes: a spare from
        the pool, whose pages are there already, else fresh memory."""
        path = os.path.join(self.snap_dir(generation), f"rank{rank}.slot0")
        return self.spare_or_fresh(path, size, f"rank {rank}")

    def spare_or_fresh(self, path: str, size: int, what: str) -> Any:
        """A mapping of `path`, at least `size` bytes: a spare if one fits."""
        spare = self.pool.take(path, size)
        if spare is not None:
            return spare
        if self.pool.wanted:
            logger.warning(
                "no spare slot left for %s (%.1f MiB): it is received into fresh memory, "
                "page by page",
                what,
                size / 2**20,
            )
        return allocate(path, size)

    def adopt(self, shard: ShardId, generation: int, rank: int) -> Any:
        """Give a shard held here to a new worker without copying it: its slot 0 becomes
        a hard link to the same memory. Only for a shard no other new worker restores."""
        source = next((p for s, p in self.replicas() + self.local_slots() if s == shard), None)
        if source is None:
            raise OSError(f"{shard} is no longer held here")
        path = os.path.join(self.snap_dir(generation), f"rank{rank}.slot0")
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.link(source, path)
        return _map(path, writable=True)

    def link_shard(self, shard: ShardId, path: str) -> None:
        """Give `path` the file of a shard held here (OSError if it is gone)."""
        source = next((p for s, p in self.replicas() + self.local_slots() if s == shard), None)
        if source is None:
            raise OSError(f"{shard} is no longer held here")
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.link(source, path)

    def recycle(self, generation: int, ranks: list[int], keep_step: int | None) -> int:
        """Hand the slot files of earlier generations that nothing needs any more to the
        new workers, as their other slots and then as a spare; returns how many.

        Why: memory that was written once is fast to write again, while fresh memory
        costs a page fault per page (about 0.25-1 GB/s on a VM whose host backs guest
        memory lazily): without this, the first snapshot after a restart pays seconds.
        A file still linked into a new slot (an adopted shard), or holding the step just
        restored, is kept. A recycled file's header is wiped first, so it can never be
        mistaken for a snapshot. Call it once the old generation's workers are gone.
        """
        candidates = []
        for path in glob.glob(os.path.join(self.root, "snap", "gen*", "rank*.slot*")):
            match = SLOT.search(path)
            if match is None or int(match[1]) >= generation:
                continue
            try:
                links = os.stat(path).st_nlink
            except OSError:
                continue
            header = _header_of(path)
            held = header is not None and header.state == COMMITTED and header.step == keep_step
            if links == 1 and not held:
                candidates.append((_size(path), path))
        candidates.sort(reverse=True)
        directory = self.snap_dir(generation)
        targets = [
            os.path.join(directory, f"rank{r}.slot{i}")
            for i in range(1, SLOTS_PER_RANK)
            for r in ranks
        ]
        targets += [os.path.join(directory, f"rank{r}.spare") for r in ranks]
        done = 0
        for target, (_, source) in zip(targets, candidates, strict=False):
            if os.path.exists(target):
                continue
            try:
                fd = os.open(source, os.O_WRONLY)
                try:
                    os.pwrite(fd, bytes(HEADER_SIZE), 0)
                finally:
                    os.close(fd)
                os.rename(source, target)
                done += 1
            except OSError as exc:
                logger.warning("cannot recycle %s: %s", source, exc)
        return done

    def prune(self, keep_from: int, keep: Written | None = None) -> None:
        """Forget the shards of generations before keep_from, but for `keep`'s: the
        shards of its step written in its generation (a save a resharding load read,
        which a second failure before the next save must be able to read again)."""

        def kept(shard: ShardId) -> bool:
            return keep is not None and (shard.generation, shard.step) == keep

        slots = {path for shard, path in self.local_slots() if kept(shard)}
        for directory in glob.glob(os.path.join(self.root, "snap", "gen*")):
            if int(directory.rsplit("gen", 1)[1]) >= keep_from:
                continue
            if not any(path.startswith(directory + os.sep) for path in slots):
                shutil.rmtree(directory, ignore_errors=True)
                continue
            for path in glob.glob(os.path.join(directory, "*")):
                if path not in slots:
                    with contextlib.suppress(OSError):
                        os.remove(path)
        with self._lock:
            for shard in [s for s in self._replicas if s.generation < keep_from]:
                if not kept(shard):
                    del self._replicas[shard]
            replicas = {path for path, _ in self._replicas.values()}
        for path in glob.glob(os.path.join(self.root, "replica", "g*")):
            match = REPLICA.search(path)
            if match and int(match[1]) < keep_from and path not in replicas:
                buffer = self._maps.pop(path, None)
                if buffer is not None:
                    with contextlib.suppress(BufferError):  # a get still sends from it:
                        buffer.close()  # closed once that ends
                with contextlib.suppress(OSError):
                    os.remove(path)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _header_of(path: str) -> ShardHeader | None:
    """The committed header of a slot file, if it fits the file (else None, and a
    misfit is reported once)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEADER_SIZE)
            length = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    return fitting_header(head, length, path)


def _map(path: str, writable: bool) -> mmap.mmap:
    with open(path, "r+b" if writable else "rb") as handle:
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(handle.fileno(), 0, access=access)


def allocate(path: str, size: int) -> mmap.mmap:
    # A new file, never the old one truncated: the old name may be a hard link to a
    # shard another slot still holds (adopt), as after a restore attempt that is redone.
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
        except OSError as exc:
            os.remove(path)
            error = no_space(os.path.dirname(path), size, "a snapshot shard", exc)
            if error is None:
                raise
            raise error from None
        return mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)
