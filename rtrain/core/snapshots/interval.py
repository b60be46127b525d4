"""One snapshot interval for the whole job (the adapt policy, job-wide).

Under RTRAIN_SNAPSHOT_POLICY=adapt each worker measures what replication costs and
wants an interval k (keep every k-th step: core/worker/cadence.py); alone, each rank
kept its own k, so one rank's three slots could move past every step a slower rank
kept, and a failure restored an older step. Here the agents agree on one k:

- each node wants the largest k its ranks want (NodeWant: up at once, down only after
  LOWER_AFTER_S of wanting less, so a wobbling measure costs no store writes) and
  publishes it once per change (one key per node);
- the job's k is the largest any node wants; the node whose want changes it appends
  a Change to the job's Schedule (one compare-and-set per job-wide change);
- a change takes effect at a step index every rank agrees on: the first multiple of
  the larger of the old and the new k at least LEAD_S of steps past the index the
  appending node's workers reached (twice that for a smaller k), so that every agent
  has read it and told its workers before they get there, and the kept steps stay
  aligned on step numbers: every rank keeps the same steps.

The step index is step // gap (gap: the smallest distance between two snapshot()
calls, the same on every rank of a job that snapshots every gap-th step).

Pure: no I/O, no clock; the agent (agent/snapshots/interval.py) and the worker call it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

POLICY_VARIABLE = "RTRAIN_SNAPSHOT_POLICY"  # in rtrain launch's environment, and so the workers'
POLICIES = ("wait", "adapt")
DEFAULT_POLICY = "adapt"
MAX_INTERVAL = 1024
LOWER_AFTER_S = 5.0  # a node wants a smaller k only after wanting it this long
LEAD_S = 1.0  # how far ahead of the appending node's workers a change takes effect
DEFAULT_LEAD = 64  # step indices, while no step time is known yet
MAX_LEAD = 1 << 20
MAX_ENTRIES = 16  # the schedule keeps its newest changes only
MAX_ENCODED = 4096  # bytes: a longer schedule is refused, not parsed
INTERVAL_FILE = "interval"  # the schedule the agent hands its workers, in their slot folder


def power_of_two(value: int) -> int:
    """value as a snapshot interval: the next power of two, within 1..MAX_INTERVAL."""
    interval = 1
    while interval < value and interval < MAX_INTERVAL:
        interval *= 2
    return interval


@dataclass(frozen=True)
class Change:
    start: int  # the first step index kept at this interval
    interval: int


@dataclass(frozen=True)
class Schedule:
    """The job's intervals over step indices, oldest change first (start 0 first)."""

    changes: tuple[Change, ...] = (Change(0, 1),)

    @property
    def last(self) -> Change:
        return self.changes[-1]

    def interval_at(self, index: int) -> int:
        """The interval at step index `index` (1 before the oldest change kept)."""
        interval = 1
        for change in self.changes:
            if change.start > index:
                break
            interval = change.interval
        return interval

    def due(self, index: int) -> bool:
        """Whether step index `index` is one every rank keeps."""
        return index % self.interval_at(index) == 0

    def guard(self) -> int:
        """After a shrink, the interval before it (else 1): a rank keeps its newest step
        on that interval out of its slots' rotation, since a rank that learns of the
        shrink late kept only those steps meanwhile, and the two then still share one."""
        if len(self.changes) > 1 and self.changes[-2].interval > self.last.interval:
            return self.changes[-2].interval
        return 1

    def then(self, interval: int, reached: int, lead: int) -> Schedule:
        """This schedule with the job's interval becoming `interval` at the first index
        aligned on both intervals, `lead` indices (twice that when it shrinks) past
        `reached` and past the last change."""
        last = self.last
        if interval == last.interval:
            return self
        step = max(interval, last.interval)
        ahead = lead * 2 if interval < last.interval else lead
        earliest = max(reached + ahead, last.start + 1)
        start = -(-earliest // step) * step
        return Schedule((*self.changes, Change(start, interval))[-MAX_ENTRIES:])

    def encode(self) -> bytes:
        return json.dumps([[c.start, c.interval] for c in self.changes]).encode()

    @staticmethod
    def decode(payload: bytes | None) -> Schedule | None:
        """A schedule read from the store or the agent's file, checked; None if unset
        or not one (too long, not ascending, an interval that is no power of two)."""
        if not payload or len(payload) > MAX_ENCODED:
            return None
        try:
            raw = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_ENTRIES:
            return None
        changes: list[Change] = []
        for item in raw:
            if not (isinstance(item, list) and len(item) == 2):
                return None
            start, interval = item
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in item):
                return None
            if start < 0 or interval < 1 or interval > MAX_INTERVAL:
                return None
            if interval & (interval - 1) or (changes and start <= changes[-1].start):
                return None
            changes.append(Change(start, interval))
        return Schedule(tuple(changes))


def job_interval(wants: Iterable[int | None]) -> int:
    """The job's interval: the largest any node wants (a node that said nothing: 1)."""
    return max((power_of_two(w) for w in wants if w), default=1)


def lead_indices(seconds_per_index: float | None, lead_s: float = LEAD_S) -> int:
    """How many step indices LEAD_S of training takes (DEFAULT_LEAD while not known)."""
    if not seconds_per_index or seconds_per_index <= 0 or not math.isfinite(seconds_per_index):
        return DEFAULT_LEAD
    return min(max(math.ceil(lead_s / seconds_per_index), 1), MAX_LEAD)


class NodeWant:
    """The interval a node publishes: what its ranks want, up at once, down only after
    LOWER_AFTER_S of wanting less (then the largest wanted meanwhile)."""

    def __init__(self) -> None:
        self.published: int | None = None
        self._low_since: float | None = None
        self._low_max = 1

    def observe(self, wanted: int, now: float) -> int | None:
        """The ranks want `wanted` at `now`: the new value to publish, or None."""
        wanted = power_of_two(wanted)
        if self.published is None or wanted > self.published:
            self.published, self._low_since = wanted, None
            return wanted
        if wanted == self.published:
            self._low_since = None
            return None
        if self._low_since is None:
            self._low_since, self._low_max = now, wanted
            return None
        self._low_max = max(self._low_max, wanted)
        if now - self._low_since < LOWER_AFTER_S:
            return None
        self.published, self._low_since = self._low_max, None
        return self.published


def needs_change(last: int, want: int, previous: int | None) -> bool | None:
    """After a node published `want` (before: `previous`), with the job at `last`:
    True: the job's interval becomes `want` (no node wants more than `last`); None:
    the job may shrink, read every node's want (job_interval); False: nothing to do."""
    if want > last:
        return True
    if want < last and (previous is None or previous >= last):
        return None
    return False


SMOOTHING = 0.3  # the weight of the newest measure in IndexRate's running mean


class IndexRate:
    """Seconds per step index, from the indices a node's workers reached and when."""

    def __init__(self) -> None:
        self.seconds: float | None = None
        self._last: tuple[int, float] | None = None
        self.reached = -1

    def observe(self, index: int, now: float) -> None:
        if index <= self.reached:
            return
        self.reached = index
        if self._last is not None:
            measured = (now - self._last[1]) / (index - self._last[0])
            if self.seconds is None:
                self.seconds = measured
            else:
                self.seconds += SMOOTHING * (measured - self.seconds)
        self._last = (index, now)
