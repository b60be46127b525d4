"""Which steps snapshot() keeps: every k-th, k adapting to what replication costs.

A snapshot may only overwrite a slot once the newest one is replicated (the agent's
checksums and copies to peers, core/worker/snapshots.py). When replication is slower
than the steps between snapshots, the old policy made the step wait for it. Instead,
snapshot() now skips the step and takes snapshots every k steps, k chosen from the
measured cost (GEMINI's way: the checkpoint interval follows the time the traffic
needs):

- k is a power of two and the kept steps are those whose index (step / the smallest
  gap seen between two steps) is a multiple of k, so ranks keeping different k still
  keep the steps of the largest k in common;
- each replicated snapshot tells how long the agent took (the shard header's
  replicate_us, core/snapshots/header.py): k becomes the smallest power of two whose
  steps outlast that time by MARGIN, never above MAX_INTERVAL (a slow start, a peer
  not yet listening, costs a few skipped steps, not a long interval after it);
- a due step that finds the newest snapshot still unreplicated is skipped (the step
  pays nothing) and k at least doubles.

The agent reads k from each shard's header and says when it changes
(a `snapshot_interval` event, agent/snapshots/replicator.py).

Under rtrain's agent that k is only what the rank wants: the agents agree on one k for
the whole job (core/snapshots/interval.py) and hand it to their workers as a schedule
(JobSchedule, a file in the slot folder), and every rank keeps the steps it says. A
due step that finds the last snapshot unreplicated then waits for it, as under the
wait policy, and asks for a larger k: skipping it would leave this rank without a
step the others keep. Without a schedule (no agent that writes one) each rank keeps
its own k, as described above.
"""

from __future__ import annotations

import math
import os

from ..snapshots.interval import INTERVAL_FILE, MAX_ENCODED, MAX_INTERVAL, Schedule, power_of_two

MARGIN = 1.25
SMOOTHING = 0.2  # the weight of the newest step time in the running mean


class Cadence:
    def __init__(self) -> None:
        self.interval = 1
        self.step_s: float | None = None  # the mean seconds per step index
        self._gap: int | None = None
        self._last: tuple[int, float] | None = None  # (step, when) of the last call
        self._waited = 0.0  # seconds the last calls waited for a replication
        self._took = 0.0  # the last replication's seconds

    def observe(self, step: int, now: float) -> None:
        """A snapshot() call for `step` at `now` (monotonic seconds)."""
        if self._last is not None and step > self._last[0]:
            gap = step - self._last[0]
            self._gap = gap if self._gap is None else min(self._gap, gap)
            # the steps' own time: a wait for replication is what k is to avoid
            elapsed = max(now - self._last[1] - self._waited, 0.0)
            per_index = elapsed / (gap / self._gap)
            if self.step_s is None:
                self.step_s = per_index
            else:
                self.step_s += SMOOTHING * (per_index - self.step_s)
        self._last, self._waited = (step, now), 0.0

    @property
    def gap(self) -> int:
        """The smallest gap between two snapshot() steps seen (0: not known yet)."""
        return self._gap or 0

    def index(self, step: int) -> int:
        """The step's index: step // gap."""
        return step // self._gap if self._gap else step

    def due(self, step: int) -> bool:
        """Whether `step` is one to keep."""
        return self.index(step) % self.interval == 0

    def waited(self, seconds: float) -> None:
        """A snapshot() call waited this long for the last one's replication."""
        self._waited += seconds

    def behind(self, pending_s: float) -> None:
        """A due step found the newest snapshot unreplicated after pending_s seconds."""
        self.interval = min(max(self.interval * 2, self.needed(pending_s)), MAX_INTERVAL)

    def replicated(self, took_s: float, steady: bool = False) -> None:
        """The newest snapshot was replicated, in took_s seconds (0: not known). steady:
        k from the smaller of this and the last measure, so that one slow replica (a
        loaded moment) does not raise the whole job's k."""
        if took_s <= 0:
            return
        measured = min(took_s, self._took) if steady and self._took else took_s
        self._took = took_s
        self.interval = self.needed(measured)

    def needed(self, seconds: float) -> int:
        """The smallest power-of-two interval whose steps outlast `seconds` by MARGIN."""
        if not self.step_s or self.step_s <= 0:
            return 1
        steps = seconds * MARGIN / self.step_s
        return power_of_two(math.ceil(min(steps, MAX_INTERVAL)))


class JobSchedule:
    """The job's schedule as this node's agent hands it over (INTERVAL_FILE in the slot
    folder, replaced whole at each change): read again only when the file changed, so
    a step pays one stat."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, INTERVAL_FILE)
        self.schedule: Schedule | None = None
        self._seen: tuple[int, int, int] | None = None

    def read(self) -> tuple[Schedule | None, bool]:
        """(the schedule, or None without one; whether it changed since the last read)."""
        try:
            found = os.stat(self.path)
        except OSError:
            return self.schedule, False
        identity = (found.st_ino, found.st_mtime_ns, found.st_size)
        if identity == self._seen:
            return self.schedule, False
        self._seen = identity
        try:
            with open(self.path, "rb") as handle:
                payload = handle.read(MAX_ENCODED + 1)
        except OSError:
            return self.schedule, False
        schedule = Schedule.decode(payload)
        if schedule is None or schedule == self.schedule:
            return self.schedule, False
        self.schedule = schedule
        return schedule, True
