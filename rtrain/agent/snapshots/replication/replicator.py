"""Replicator: checksums each new snapshot of this node's workers and copies it to peers.

It runs on its own thread, off the training step's path. For every worker slot that
holds a committed snapshot not yet replicated it computes the chunk checksums, sends
the shard to the ring successors (core.snapshots.restore_plan.ring_successors), and then marks
the slot replicated, with the time it took, which is what lets the worker's next
snapshot go ahead; a worker whose replication falls behind keeps every k-th step
(core/worker/cadence.py) and writes k into each shard's header: a `snapshot_interval`
event says when it changes. A peer that cannot take the shard is retried on the next
pass; if it is gone for good, its lease expiry ends the generation.
"""

from __future__ import annotations

import glob
import logging
import mmap
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ....core.clock import Clock
from ....core.snapshots.format import (
    HEADER_SIZE,
    SLOTS_PER_RANK,
    replicated_step,
    set_replicate_time,
    set_replicated,
    shard_gap,
    shard_interval,
)
from ....core.snapshots.restore_plan import ShardId
from ...net.limits import RateLimitedLog
from ...observe.events import emit
from ...waiting import SYSTEM_CLOCK
from ..checksums import checksums
from ..disk.checkpoints import DiskCheckpointer
from ..peers.transport import Address, ShardTransport
from ..peers.wire import ShardError
from ..shard_store import SLOT, ShardStore
from ..slot_check import fitting_header
from .interval import JobInterval
from .wake_fifo import WakeFifo

logger = logging.getLogger(__name__)

# A worker's next snapshot waits for this pass: poll often, but only the slot headers
# (mapped already); once every rank has all its slot files, the folder itself is listed
# again only every RESCAN_S. Idle passes back off from POLL_S to IDLE_POLL_S and any
# work brings the poll back to POLL_S: polling every 2 ms for ever, with a folder listing
# each time while a job has no slot files (a job that never snapshots), took 7% of a core
# and slowed 2-worker jobs on 2 cores by up to a third against torchrun.
POLL_S = 0.002
IDLE_POLL_S = 0.064
# Until this generation's workers have written a slot file at all (a job that does not
# snapshot, or has not yet), a pass every NO_SLOTS_POLL_S: each wakeup costs an idle
# agent about half a millisecond of CPU on a VM, and 15 a second were 0.9 % of a core,
# more than the rest of the agent. A first snapshot waits for it once per generation.
NO_SLOTS_POLL_S = 0.25
RESCAN_S = 0.5
# A `replication` event for the traffic so far at most this often (and at a
# generation's end): the throughput over time without an event per replica.
EVENT_S = 30.0


class CommitListener(Protocol):
    """What the rest of the agent learns from the replicating thread, on that thread."""

    def committed(self, rank: int, step: int) -> None:
        """A worker of this node committed `step` (seen before its replica is sent)."""
        ...

    def between_passes(self) -> None:
        """After every pass: the workers' shard requests are looked for here, so that
        they cost no wakeups of their own."""
        ...


@dataclass
class Traffic:
    """Replicas sent, and their bytes: as sent, and as whole shards would have been."""

    replicas: int = 0
    sent_bytes: int = 0
    full_bytes: int = 0
    seconds: float = 0.0  # spent sending them

    def add(self, sent: int, full: int, seconds: float = 0.0) -> None:
        self.replicas += 1
        self.sent_bytes += sent
        self.full_bytes += full
        self.seconds += seconds

    def __str__(self) -> str:
        saved = 1 - self.sent_bytes / self.full_bytes if self.full_bytes else 0.0
        return (
            f"{self.replicas} replicas, {self.sent_bytes / 1024:.1f} KiB sent of "
            f"{self.full_bytes / 1024:.1f} KiB ({saved:.1%} held by DP twins, not sent)"
        )


class Replicator:
    def __init__(
        self,
        store: ShardStore,
        transport: ShardTransport,
        listener: CommitListener | None = None,
        interval: JobInterval | None = None,
        checkpointer: DiskCheckpointer | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """clock: what a replica took, and when the last `replication` event was.
        transport: how replicas reach the peers (peers/transport.py); listener: told
        of every snapshot this node's own workers commit, and after every pass;
        interval: the job-wide interval under the adapt policy (interval.py), told
        (rank, step, wanted interval, step gap, the rank's last replica's seconds) of
        every shard, which then says when it changes instead of this; checkpointer:
        handed every shard replicated, for --checkpoint-dir."""
        self._clock = clock
        self._store = store
        self._transport = transport
        self._listener = listener
        self._interval = interval
        self._checkpointer = checkpointer
        self._world_size = 0
        self._generation: int | None = None
        self._peers: list[Address] = []
        self._maps: dict[str, tuple[tuple[int, int], mmap.mmap]] = {}  # (inode, size)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._warned: set[tuple[str, int, int]] = set()  # (peer, rank, step)
        self._failures = RateLimitedLog(logger)
        self._paths: list[str] = []
        self._twins: dict[int, list[int | None]] = {}
        self._intervals: dict[int, tuple[int, float]] = {}  # rank -> (interval, its last time)
        self.sent = Traffic()  # this generation's
        self._unreported = Traffic()  # since the last `replication` event
        self._emitted = self._clock.now()
        self.newest_replicated: int | None = None  # the newest step sent to every peer
        self._rescan_at = 0.0
        self._slot_files = 0
        self._wake = WakeFifo()  # workers' wakeups after each commit (wake_fifo.py)
        self._thread = threading.Thread(target=self._run, name="rtrain-replicate", daemon=True)
        self._thread.start()

    @property
    def has_peers(self) -> bool:
        """Whether this generation's shards go to any peer (a single node has none: its
        slots are marked replicated for its workers, but nothing is held elsewhere)."""
        return bool(self._peers)

    def follow(
        self,
        generation: int,
        peers: list[Address],
        world_size: int,
        local_ranks: int,
        twins: Mapping[int, list[int | None]] | None = None,
    ) -> None:
        """Replicate the slots of `generation` (this node's local_ranks workers,
        SLOTS_PER_RANK slot files each) to these peers (host, shard port). twins: rank ->
        for each peer, the rank there whose shard of the same step a replica is sent
        against (delta.py)."""
        with self._lock:
            self._report()
            self._twins = dict(twins or {})
            self._generation, self._peers = generation, list(peers)
            self._slot_files = SLOTS_PER_RANK * local_ranks
            self._paths, self._rescan_at = [], 0.0
            self._intervals = {}
            self._wake.follow(self._store.snap_dir(generation))
            self._world_size = world_size
            self._transport.hang_up()
            for _, buffer in self._maps.values():
                buffer.close()
            self._maps = {}

    def pause(self) -> None:
        """Stop replicating until the next follow(): a restore is about to relabel the
        old generation's shards (an adopted slot's replicated mark is reset), and
        sending them again to peers that moved on is refused noise."""
        with self._lock:
            self._report()
            self._generation = None

    def close(self) -> None:
        self._closed.set()
        # A put to a stopped peer holds the lock for up to its IO timeout: an agent on
        # its way out does not wait for it, it only leaves out the traffic line.
        if self._lock.acquire(timeout=0.2):
            try:
                self._report()
            finally:
                self._lock.release()
        self._thread.join(timeout=1)  # a put to a stopped peer may hang: it is a daemon
        if not self._thread.is_alive():  # else it may still wait on the FIFO: left open
            self._wake.close()

    def _report(self) -> None:
        """Log what this generation's replicas cost, once, and start counting anew."""
        if self._generation is not None and self.sent.full_bytes:
            logger.info("replication in generation %d: %s", self._generation, self.sent)
        self.sent = Traffic()
        self._emit()

    def _emit(self) -> None:
        """A `replication` event for what was sent since the last one."""
        traffic, self._unreported, self._emitted = self._unreported, Traffic(), self._clock.now()
        if traffic.replicas:
            emit(
                "replication",
                of_generation=self._generation,
                replicas=traffic.replicas,
                sent_bytes=traffic.sent_bytes,
                full_bytes=traffic.full_bytes,
                seconds=round(traffic.seconds, 6),
            )

    def _run(self) -> None:
        pause = POLL_S
        while not self._closed.is_set():
            with self._lock:
                try:
                    busy = self._generation is not None and self._pass(self._generation)
                except Exception as exc:  # the thread must outlive any pass
                    # A pass that failed (no descriptor left, no memory) is tried again
                    # after a pause; a dead thread would leave every snapshot unreplicated.
                    self._failures.warn(
                        type(exc).__name__, "replication pass failed, retrying: %r", exc
                    )
                    busy = False
                if self._clock.now() - self._emitted >= EVENT_S:
                    self._emit()
            if self._listener is not None:
                self._listener.between_passes()
            longest = IDLE_POLL_S if self._paths else NO_SLOTS_POLL_S
            pause = POLL_S if busy else min(pause * 2, longest)
            if not busy:
                self._wake.wait(pause, self._closed)

    def _pass(self, generation: int) -> bool:
        now = self._clock.now()
        # Until every worker has both its slot files, look for new ones on every pass.
        if len(self._paths) < self._slot_files or now >= self._rescan_at:
            pattern = os.path.join(self._store.snap_dir(generation), "rank*.slot*")
            self._paths, self._rescan_at = sorted(glob.glob(pattern)), now + RESCAN_S
        worked = False
        for path in self._paths:
            buffer = self._map(path)
            if buffer is None:
                continue
            # The header and the replicated mark in one read: read apart, a worker that
            # starts rewriting the slot in between made an old step look unreplicated.
            # One copy suffices: a worker writes the state (WRITING) before the step and
            # commits by the state alone, last, so a copy its writes tear never shows a
            # committed step that is not (tests/integration/test_shard_faults.py).
            head = bytes(buffer[:HEADER_SIZE])
            # Checked against the slot's file before any size of it is used: a header
            # that does not fit is a corrupt slot, never checksummed, sent or counted.
            # (One that fits a file grown since it was mapped is mapped again next pass.)
            header = fitting_header(head, max(len(buffer), _file_size(path)), path)
            if header is None or header.size > len(buffer):
                continue
            if replicated_step(head) >= header.step:
                continue
            match = SLOT.search(path)
            assert match is not None
            shard = ShardId(generation, int(match[2]), header.step)
            self._note_interval(shard, shard_interval(head), shard_gap(head))
            began = self._clock.now()
            crcs = checksums(buffer, header.size)
            if bytes(buffer[:HEADER_SIZE]) != head:
                continue  # rewritten while it was checksummed: the next pass takes it
            if self._listener is not None:
                self._listener.committed(shard.rank, header.step)
            self._store.remember_crcs(shard, crcs)
            error = self._send(shard, buffer, header.size, crcs)
            if error is not None:
                if bytes(buffer[:HEADER_SIZE]) == head:
                    self._warn_once(shard, error)
                continue
            if self._checkpointer is not None:
                self._checkpointer.offer(
                    shard.rank, shard.step, self._world_size, buffer[: header.size], crcs
                )
            took = self._clock.now() - began
            set_replicate_time(buffer, took)  # before the mark: the worker reads both
            set_replicated(buffer, header.step)
            self._intervals[shard.rank] = (self._intervals.get(shard.rank, (1, 0.0))[0], took)
            self.newest_replicated = max(self.newest_replicated or -1, header.step)
            worked = True
        return worked

    def _send(self, shard: ShardId, buffer: Any, size: int, crcs: list[int]) -> str | None:
        """None once every peer holds the shard, else what went wrong (retried later)."""
        twins = self._twins.get(shard.rank, [])
        for index, peer in enumerate(self._peers):
            twin = twins[index] if index < len(twins) else None
            base = None if twin is None else ShardId(shard.generation, twin, shard.step)
            try:
                began = self._clock.now()
                sent = self._transport.send_replica(peer, shard, buffer, size, crcs, base)
                took = self._clock.now() - began
                self.sent.add(sent, size, took)
                self._unreported.add(sent, size, took)
            except (OSError, ShardError) as exc:
                return f"{peer[0]}:{peer[1]}: {exc}"
        return None

    def _note_interval(self, shard: ShardId, interval: int, gap: int) -> None:
        """A `snapshot_interval` event when a rank's interval differs from its last."""
        if interval <= 0:
            return  # not written by a worker that keeps one
        previous, took = self._intervals.get(shard.rank, (1, 0.0))
        if self._interval is not None:
            self._interval.note(shard.rank, shard.step, interval, gap, took)
            self._intervals[shard.rank] = (interval, took)
            return
        if interval != previous:
            logger.info(
                "rank %d keeps one step in %d from step %d (its last replica took %.3f s)",
                shard.rank,
                interval,
                shard.step,
                took,
            )
            emit(
                "snapshot_interval",
                rank=shard.rank,
                step=shard.step,
                interval=interval,
                previous=previous,
                replicate_s=round(took, 6),
            )
        self._intervals[shard.rank] = (interval, took)

    def _warn_once(self, shard: ShardId, error: str) -> None:
        key = (error.split(": ", 1)[0], shard.rank, shard.step)
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("replicating %s to %s", shard, error)

    def _map(self, path: str) -> mmap.mmap | None:
        """The slot file's mapping, re-made when the file changed size or was replaced:
        a worker that restored without a copy replaces that slot rather than overwrite
        the memory its tensors still map."""
        try:
            stat = os.stat(path)
        except OSError:
            return None
        identity = (stat.st_ino, stat.st_size)
        known = self._maps.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        if known is not None:
            known[1].close()
            del self._maps[path]
        if stat.st_size == 0:
            return None
        with open(path, "r+b") as handle:
            buffer = mmap.mmap(handle.fileno(), stat.st_size)
        self._maps[path] = (identity, buffer)
        return buffer


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
