"""JobInterval: this node's part in agreeing on one snapshot interval for the job.

Under the adapt policy (core/snapshots/interval.py has the rules) each worker writes
the interval it wants into its shards' header; the replicator hands those here
(note). At each of the generation monitor's store checks (agent/monitor.py, every
STORE_CHECK_S), on the agent's main loop, so that a store that stops answering is
met there as by every other read, this node:

- publishes the interval its ranks want (NodeWant) under r<g>/snap_want/<node>, once
  per change;
- when that raises the job's interval, or may lower it (then every node's want is read
  in one multi_get), appends the change to the job's schedule, r<g>/snap_interval, by
  compare-and-set, taking effect LEAD_S of steps past where its workers are: their
  heartbeats' steps, read at the same check, and the replicator's notes (which come
  a replication late: taken alone, a change started at a step the workers had passed,
  1.7-7.9 s late on a loaded machine);
- reads the schedule (a get on TCPStore, a watch on etcd) and, when it changed, hands
  it to its workers (INTERVAL_FILE in their slot folder, replaced whole) and says so:
  a `snapshot_interval` event per local rank, scope "job", with the step the change
  starts at.

What it costs the store: one set per node per change of its want (at most one a
LOWER_AFTER_S down, and log2(MAX_INTERVAL) up), one compare-and-set per job-wide change
(plus one multi_get of N keys when a want goes down), and one read of the schedule key
per node every store check (0.25 s) once its workers snapshot under adapt (a watch on etcd; nothing
under wait or in a job that does not snapshot). Never one per step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ....core.clock import Clock
from ....core.errors import RendezvousError, StoreUnavailable
from ....core.rendezvous.keys import StoreKeys
from ....core.snapshots.interval import (
    DEFAULT_POLICY,
    INTERVAL_FILE,
    POLICY_VARIABLE,
    IndexRate,
    NodeWant,
    Schedule,
    job_interval,
    lead_indices,
    needs_change,
)
from ...net.limits import RateLimitedLog
from ...observe.events import emit
from ...store.kv import KeyValueStore
from ...waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

CHANGE_TRIES = 8  # compare-and-set attempts before the next poll tries again


def adapt_policy() -> bool:
    """Whether this launch's workers take the adapt policy (their environment is ours)."""
    return (os.environ.get(POLICY_VARIABLE) or DEFAULT_POLICY) == "adapt"


@dataclass
class _Followed:
    generation: int
    node_rank: int
    nodes: int
    folder: str  # the workers' slot folder
    read: Callable[[], bytes | None]  # the schedule key's latest value


class JobInterval:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        active: bool | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """active: whether the workers take the adapt policy (default: adapt_policy());
        clock: when a step index was reached and a want observed (the rates')."""
        self._clock = clock
        self._store = store
        self._keys = keys
        self.active = adapt_policy() if active is None else active
        self._lock = threading.Lock()  # note() comes from the replicator's thread
        self._followed: _Followed | None = None
        self._wants: dict[int, int] = {}  # local rank -> the interval it wants
        self._ranks: list[int] = []  # this generation's local ranks
        self._gap = 1
        self._took = 0.0  # the last replica's seconds, for the event
        self._rate = IndexRate()
        self._want = NodeWant()
        self.schedule = Schedule()
        self._failures = RateLimitedLog(logger)

    def follow(
        self, generation: int, node_rank: int, nodes: int, folder: str, ranks: list[int]
    ) -> None:
        """A new generation: its workers (local ranks `ranks`, slot folder `folder`)
        start at interval 1."""
        with self._lock:
            self._wants, self._gap, self._took, self._ranks = {}, 1, 0.0, list(ranks)
            self._rate, self._want, self.schedule = IndexRate(), NodeWant(), Schedule()
            self._followed = None
            if not self.active:
                return
            try:
                self._hand_over(folder, self.schedule)
            except OSError as exc:  # the workers then wait at every step, as under wait
                logger.warning("no snapshot interval for the workers in %s: %s", folder, exc)
            read = self._store.follow(self._keys.snapshot_schedule(generation))
            self._followed = _Followed(generation, node_rank, nodes, folder, read)

    def use_store(self, store: KeyValueStore) -> None:
        """The job's store carried over to a new one (agent/kube/store_return.py)."""
        with self._lock:
            self._store = store

    def pause(self) -> None:
        with self._lock:
            self._followed = None

    def note(self, rank: int, step: int, wanted: int, gap: int, took: float) -> None:
        """A shard of local rank `rank` at `step` wants `wanted` (gap: its snapshot()
        calls' step gap; took: the rank's last replica's seconds). Replicator's thread."""
        with self._lock:
            gap = max(gap, 1)
            if gap != self._gap:
                self._gap, self._rate = gap, IndexRate()
            self._wants[rank] = max(wanted, 1)
            self._rate.observe(step // gap, self._clock.now())
            self._took = took

    def poll(self, steps: Sequence[int] = ()) -> None:
        """Publish this node's want if it changed, change the job's if it must, and hand
        a changed schedule to the workers. steps: this node's workers' latest heartbeat
        steps. A lost store raises (StoreUnavailable), as at any other read of the
        generation loop; anything else is said and retried."""
        self._observe(steps)
        try:
            self._poll()
        except (StoreUnavailable, RendezvousError):
            raise
        except Exception as exc:  # retried at the next check; the workers keep the last
            self._failures.warn(type(exc).__name__, "snapshot interval: %r", exc)

    def _observe(self, steps: Sequence[int]) -> None:
        """Where the workers are now, from their heartbeats: once they snapshot (the
        step gap is known from the replicator's first note), the furthest heartbeat's
        step index counts as reached."""
        if not steps:
            return
        with self._lock:
            if self._followed is not None and self._wants:
                self._rate.observe(max(steps) // self._gap, self._clock.now())

    def _poll(self) -> None:
        with self._lock:
            followed, wants = self._followed, dict(self._wants)
        if followed is None or not wants:
            return  # nothing asked of the store before this node's workers snapshot
        previous = self._want.published
        want = self._want.observe(max(wants.values()), self._clock.now())
        if want is not None:
            key = self._keys.snapshot_want(followed.generation, followed.node_rank)
            self._store.set(key, str(want))
            self._change(followed, want, previous)
        self._read(followed)

    def _change(self, followed: _Followed, want: int, previous: int | None) -> None:
        """Append the job's new interval to the schedule, if this want changes it."""
        key = self._keys.snapshot_schedule(followed.generation)
        for _ in range(CHANGE_TRIES):
            held = self._store.get(key)
            schedule = Schedule.decode(held) or Schedule()
            last = schedule.last.interval
            decision = needs_change(last, want, previous)
            if decision is False:
                return
            target = want
            if decision is None:  # lower: the largest any node wants
                keys = [
                    self._keys.snapshot_want(followed.generation, n) for n in range(followed.nodes)
                ]
                target = job_interval(_number(v) for v in self._store.multi_get(keys))
                if target >= last:
                    return
            with self._lock:
                reached, seconds = self._rate.reached, self._rate.seconds
            lead = lead_indices(seconds)
            changed = schedule.then(target, max(reached, 0), lead)
            desired = changed.encode()
            if self._store.compare_set(key, held or b"", desired) == desired:
                # when, and how far ahead of the workers: a change its nodes learn
                # of after its start is visible against this line
                logger.info(
                    "appended to the job's schedule: one step in %d from index %d "
                    "(this node's workers at index %d, lead %d)",
                    target,
                    changed.last.start,
                    reached,
                    lead,
                )
                return

    def _read(self, followed: _Followed) -> None:
        schedule = Schedule.decode(followed.read())
        if schedule is None or schedule == self.schedule:
            return
        with self._lock:
            gap, took, ranks = self._gap, self._took, list(self._ranks)
        self._hand_over(followed.folder, schedule)  # an OSError: again at the next poll
        before, self.schedule = self.schedule, schedule
        known = set(before.changes)
        for change in schedule.changes:
            if change in known:
                continue
            previous = schedule.interval_at(change.start - 1) if change.start else 1
            logger.info(
                "the job keeps one step in %d from step %d (this node's ranks want %s)",
                change.interval,
                change.start * gap,
                self._want.published,
            )
            for rank in ranks:
                emit(
                    "snapshot_interval",
                    rank=rank,
                    step=change.start * gap,
                    interval=change.interval,
                    previous=previous,
                    replicate_s=round(took, 6),
                    scope="job",
                    wanted=self._want.published,
                )

    @staticmethod
    def _hand_over(folder: str, schedule: Schedule) -> None:
        """The schedule to the workers: written aside, then renamed over the old one."""
        path = os.path.join(folder, INTERVAL_FILE)
        temporary = f"{path}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(schedule.encode())
        os.replace(temporary, path)


def _number(value: bytes | None) -> int | None:
    """A node's published want, or None (unset, or not a small number)."""
    if value is None or len(value) > 8:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None
