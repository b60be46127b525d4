"""snapshot() and restore(): the training script's side of in-memory checkpoints.

Each worker owns three slot files in the agent's shared-memory folder
($RTRAIN_SNAPSHOT_DIR, on /dev/shm). snapshot(state, step) copies the state into the
oldest slot and marks it committed: that copy is the only work on the step's path. The
agent then checksums the slot and replicates it to peers in the background, and marks
it replicated.

A slot is only overwritten once the newest snapshot is safe on its peers, so every
rank always has a replicated snapshot no more than one kept step behind its newest.
When a snapshot comes while the previous one is still replicating, the policy
(RTRAIN_SNAPSHOT_POLICY in the worker's environment) decides:

- **wait**: the step waits for it, so every rank keeps every step and the ranks always
  share a step they can all restore;
- **adapt** (the default): the job keeps every k-th step, k chosen from what
  replication measurably costs (core/worker/cadence.py): each rank says the k it
  wants in its shards' header, the agents agree on one k for the whole job through the
  rendezvous store and hand it over as a schedule aligned on step numbers
  (core/snapshots/interval.py), so every rank keeps the same steps, and a failure
  restores the newest step every rank kept, as under wait. A due step still waits for
  the last one's replication (and asks for a larger k); the steps between due ones
  pay nothing. While replication keeps up, k is 1: the same steps as wait. Without the
  agent's schedule the default waits as wait does, and RTRAIN_SNAPSHOT_POLICY=adapt
  set by name has each rank keep its own k and skip a due step its replication is
  behind on (the old behaviour: a failure may then restore an older step every rank
  holds).

Why three slots and not two: core/snapshots/format.py, SLOTS_PER_RANK.

The step pays the copy and nothing else: the skeleton and offsets of an unchanged
state are the last snapshot's (core/snapshots/layout_reuse.py), the byte views into
each slot are kept, checksums are the agent's, and device tensors go by an
asynchronous copy on a side stream into page-locked slot memory
(core/worker/device_copy.py).

The slots outlive the worker: the agent owns the folder. After a restart the agent puts
the restored shard into the new worker's slot before it starts, and restore() reads it.
Without rtrain (torchrun, plain python) snapshot() does nothing and restore() is None.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
import time
from typing import Any

from ..clock import wait_until
from ..contract.environment import SNAPSHOT_BUDGET, SNAPSHOT_DIR
from ..snapshots.format import (
    COMMITTED,
    EMPTY,
    SLOTS_PER_RANK,
    STATE_OFFSET,
    WAKE_FIFO,
    ShardLayout,
    SnapshotError,
    check_shard,
    header_misfit,
    interval_field,
    plan_shard,
    read_header,
    read_shard,
    replicate_time,
    replicated_step,
    write_shard,
)
from ..snapshots.interval import DEFAULT_POLICY, POLICIES, POLICY_VARIABLE, Schedule
from . import pace
from .cadence import Cadence, JobSchedule
from .device_copy import DeviceCopier
from .repair.asked import ASKED
from .stateful import dtensor_builder, load_into, meshes_in, state_of

WAIT_LIMIT_S = 300.0
SNAPSHOT_POLICY = POLICY_VARIABLE  # wait or adapt (DEFAULT_POLICY)

__all__ = ["SNAPSHOT_BUDGET", "SNAPSHOT_DIR", "SnapshotError", "restore", "slot_paths", "snapshot"]


def slot_paths(directory: str, rank: int) -> list[str]:
    return [os.path.join(directory, f"rank{rank}.slot{i}") for i in range(SLOTS_PER_RANK)]


class _Slot:
    def __init__(self, path: str) -> None:
        self.path = path
        self.map: mmap.mmap | None = None
        self.size = 0
        # Tensors returned by restore(copy=False) map this file: never write it again.
        self.pinned = False
        self.views: dict[tuple[Any, ...], Any] = {}  # write_shard's views of the map
        self.copier = DeviceCopier()

    def open_existing(self) -> None:
        if self.map is None and os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "r+b") as handle:
                self.size = os.fstat(handle.fileno()).st_size
                self.map = mmap.mmap(handle.fileno(), self.size)
            self.copier.mapping = (self.map, self.size)

    def _close(self) -> None:
        if self.map is not None:
            self.views.clear()  # views export the map's buffer: none may outlive it
            self.copier.unregister(self.map)
            self.copier.mapping = None
            self.map.close()

    def reserve(self, size: int) -> None:
        """Make the slot at least `size` bytes, with its memory allocated now: a full
        /dev/shm is an error here, not a SIGBUS in the middle of the copy."""
        if self.pinned:
            self._replace()
        if self.map is not None and self.size >= size:
            return
        self._close()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise SnapshotError(
                    f"no room for a {size / 2**20:.1f} MiB snapshot in "
                    f"{os.path.dirname(self.path)} ({exc.strerror}); free shared memory "
                    "or lower --snapshot-memory"
                ) from None
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
            self.copier.mapping = (self.map, self.size)
        finally:
            os.close(fd)

    def _replace(self) -> None:
        """Take the file restored tensors still map (their pages live on with them) out
        of the slot's name: the agent's spare file takes its place if there is one
        (memory already backed), else a fresh one will. The agent notices the new inode."""
        self._close()
        self.map, self.size, self.pinned = None, 0, False
        spare = self.path.rsplit(".slot", 1)[0] + ".spare"
        try:
            os.replace(spare, self.path)
        except FileNotFoundError:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def header_step(self) -> int | None:
        """The step of the committed snapshot the slot holds, or None: none, a torn
        one, or a header that does not fit the slot (corrupt: never waited for, read
        or kept; the next snapshot overwrites it)."""
        if self.map is None:
            return None
        header = read_header(self.map)
        if header is None or header.state != COMMITTED or header_misfit(header, self.size):
            return None
        return header.step

    def discard(self) -> None:
        """Mark the snapshot here unusable (a copy no worker can read): the agent no
        longer lists it, so no restore plans with it again."""
        if self.map is not None:
            struct.pack_into("<I", self.map, STATE_OFFSET, EMPTY)


class _Slots:
    def __init__(self, directory: str, rank: int) -> None:
        self.key = (directory, rank)
        self.slots = [_Slot(p) for p in slot_paths(directory, rank)]
        for slot in self.slots:
            slot.open_existing()
        self.cadence = Cadence()
        policy = os.environ.get(SNAPSHOT_POLICY, DEFAULT_POLICY) or DEFAULT_POLICY
        if policy not in POLICIES:
            raise SnapshotError(
                f"{SNAPSHOT_POLICY}={policy[:40]!r}: the snapshot policy is one of "
                f"{', '.join(POLICIES)}"
            )
        self.adapt = policy == "adapt"
        # adapt without the agents' schedule: each rank its own k only when asked for by
        # name; by default it then waits, as under wait
        self.own_k = os.environ.get(SNAPSHOT_POLICY) == "adapt"
        self.job = JobSchedule(directory)  # the job's k, handed over by the agent
        self.layout: ShardLayout | None = None  # the last snapshot's, reused if it fits
        self.committed_at = 0.0  # when the newest snapshot was written (monotonic)
        self._wake: int | None = None  # the agent's wake FIFO, open for writing

    def wake_agent(self) -> None:
        """Tell the agent a snapshot is committed (core/snapshots/format.py, WAKE_FIFO);
        without a FIFO or a reader on it the agent finds it at its next poll."""
        if self._wake is None:
            path = os.path.join(self.key[0], WAKE_FIFO)
            try:
                if not stat.S_ISFIFO(os.stat(path).st_mode):
                    return
                self._wake = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # none (an agent without one), or no reader (ENXIO)
                return
        try:
            os.write(self._wake, b"\0")
        except BlockingIOError:
            pass  # full: the agent has wakeups waiting
        except OSError:
            os.close(self._wake)
            self._wake = None

    def close(self) -> None:
        """Done with these slots (a repaired worker's next generation has its own): the
        wake FIFO's descriptor closed, or a worker repaired in place kept one a generation."""
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.close(self._wake)
            self._wake = None

    def drop_unshared(self, schedule: Schedule, cadence: Cadence) -> None:
        """A change learned after its start: the steps kept since that the job does not
        keep are dropped, so they push no step every rank keeps out of the slots."""
        for slot in self.slots:
            step = slot.header_step()
            if step is not None and not schedule.due(cadence.index(step)):
                slot.discard()

    def newest(self) -> _Slot | None:
        """The slot of the newest committed step (the first such slot on a tie)."""
        best: tuple[int, _Slot] | None = None
        for slot in self.slots:
            step = slot.header_step()
            if step is not None and (best is None or step > best[0]):
                best = (step, slot)
        return None if best is None else best[1]

    def open_newest(self) -> _Slot | None:
        """newest() after mapping the slots the agent filled since (a restore's)."""
        for slot in self.slots:
            slot.open_existing()
        return self.newest()

    def next_target(self, newest: _Slot | None, guard: int = 1) -> _Slot:
        """The slot the next snapshot goes to: one holding no snapshot (never written, or
        torn), else the one holding the oldest step. guard: after the job's interval
        shrank, the interval before (Schedule.guard): the newest step on it stays."""

        def age(slot: _Slot) -> int:
            step = slot.header_step()
            return -1 if step is None else step

        candidates = [s for s in self.slots if s is not newest]
        if guard > 1 and (newest is None or self.cadence.index(age(newest)) % guard):
            aligned = [
                s for s in candidates if age(s) >= 0 and self.cadence.index(age(s)) % guard == 0
            ]
            if aligned:
                kept = max(aligned, key=age)
                candidates = [s for s in candidates if s is not kept]
        return min(candidates, key=age)


_slots: _Slots | None = None


def _my_slots() -> _Slots | None:
    global _slots
    directory = os.environ.get(SNAPSHOT_DIR)
    if not directory:
        return None
    rank = int(os.environ.get("RANK", "0"))
    if _slots is None or _slots.key != (directory, rank):
        if _slots is not None:
            _slots.close()
        _slots = _Slots(directory, rank)
    return _slots


def snapshot(state: Any, step: int) -> bool:
    """Keep `state` as of `step`: nested dicts, lists and tuples of tensors, DTensors,
    numpy arrays, plain values and Stateful objects (kept as their state_dict()).

    Returns whether this step was kept: False without rtrain, and, with the adapt
    policy, False for a step skipped because replication is behind (see the module's
    doc: the step then pays nothing; keep calling it every step). Raises SnapshotError,
    naming the key and the type, for a state that cannot be kept (any other object, a
    snapshot over the memory budget, no shared memory left), before anything is
    written.
    """
    slots = _my_slots()
    if slots is None:
        return False
    now = time.monotonic()
    cadence = slots.cadence
    schedule, changed = slots.job.read() if slots.adapt else (None, False)
    adapt = slots.adapt and (schedule is not None or slots.own_k)
    if adapt:
        cadence.observe(step, now)
        if schedule is None:
            if not cadence.due(step):
                return False
        else:
            if changed:
                slots.drop_unshared(schedule, cadence)
            if not schedule.due(cadence.index(step)):
                return False
    layout = plan_shard(state_of(state), slots.layout)
    budget = int(os.environ.get(SNAPSHOT_BUDGET, "0") or 0)
    if budget and layout.size > budget:
        raise SnapshotError(
            f"a snapshot of {layout.size / 2**20:.1f} MiB does not fit this rank's share of "
            f"--snapshot-memory ({budget / 2**20:.1f} MiB per snapshot slot)"
        )
    newest = slots.newest()
    if newest is not None:
        assert newest.map is not None
        if replicated_step(newest.map) < (newest.header_step() or 0):
            if adapt:
                cadence.behind(now - slots.committed_at if slots.committed_at else 0.0)
                if schedule is None:
                    return False  # this rank's own k: skipped
            _wait_replicated(newest)  # a step every rank keeps: waited for
            cadence.waited(time.monotonic() - now)
        if adapt:
            cadence.replicated(replicate_time(newest.map), steady=schedule is not None)
    target = slots.next_target(newest, schedule.guard() if schedule else 1)
    target.reserve(layout.size)
    assert target.map is not None
    wants = interval_field(cadence.interval, cadence.gap)
    write_shard(target.map, layout, step, wants, target.views, target.copier)
    slots.layout, slots.committed_at = layout, time.monotonic()
    slots.wake_agent()
    pace.snapshotted(slots.committed_at - now)  # the wall time by cause's overhead
    return True


def _wait_replicated(slot: _Slot) -> None:
    assert slot.map is not None
    mapped, step = slot.map, slot.header_step() or 0

    def replicated() -> bool:
        return replicated_step(mapped) >= step

    if not wait_until(
        lambda: replicated() or ASKED.is_set(), WAIT_LIMIT_S, 0.001, time.monotonic, time.sleep
    ):
        raise SnapshotError(
            f"the snapshot of step {step} was not replicated within {WAIT_LIMIT_S:g}s"
        )
    if not replicated():  # the agent asked for a repair in place: this worker parks
        raise SnapshotError(f"a repair came while the snapshot of step {step} replicated")


def snapshots_kept() -> bool:
    """Whether snapshot() keeps snapshots here (the process runs under rtrain)."""
    return _my_slots() is not None


def restore(copy: bool = True, *, into: Any = None, mesh: Any = None) -> tuple[Any, int] | None:
    """(state, step) of the snapshot the agent restored for this rank, or None.

    into: the live state that was snapshotted (the same nesting, Stateful objects in
    it): the snapshot is loaded into it in place (load_state_dict for a Stateful, a
    copy into each tensor, other values replaced in its dicts), and it is returned.
    DTensors are rebuilt on an equal device mesh: one a DTensor in `into` lives on,
    or `mesh` (a DeviceMesh, or several), or, for a 1-D mesh over the whole world
    (FSDP2's usual one), one over the default process group; no equal mesh is a
    SnapshotError that says to pass `into` or `mesh`.

    copy=False returns tensors that map the restored shard instead of copies of it: no
    copy and no page faults for fresh memory, so restoring costs about a millisecond
    per GB. The mapping is private, so writing a tensor copies only the pages written,
    and rtrain never writes that file again. The price is memory: the whole shard stays
    mapped as long as any returned tensor lives (an optimizer that keeps its state
    tensors keeps all of it), on top of the snapshot slots.
    """
    slots = _my_slots()
    newest = None if slots is None else slots.open_newest()
    if newest is None or newest.map is None:
        return None
    meshes = list(meshes_in(into))
    if mesh is not None:
        meshes.extend(mesh if isinstance(mesh, (list, tuple)) else [mesh])
    build = dtensor_builder(meshes)
    try:
        check_shard(newest.map)
    except SnapshotError:
        newest.discard()  # the agent checks a copy before it gives it: this is rare
        raise
    if copy:
        state, step = read_shard(newest.map, dtensor=build)
    else:
        with open(newest.path, "rb") as handle:
            private = mmap.mmap(handle.fileno(), newest.size, access=mmap.ACCESS_COPY)
        newest.pinned = True
        state, step = read_shard(private, copy=False, dtensor=build)
    return (state if into is None else load_into(into, state)), step
