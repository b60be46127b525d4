"""The agent's own events (its start and end, each generation's start and end, the
recovery between them) and its metrics file, in one place the agent calls.

A recovery lasts until the new workers' first step, which their heartbeats give (read
with the metrics, every STORE_CHECK_S of the agent's watch): workers that started but
wait (a restore, a first snapshot whose replication cannot get through) are still
down. Workers that never give a step (a script without heartbeat(step)) end it at
their start, as before, when their generation or the job ends.

What `rtrain report` needs to count time and steps from the heartbeats rides on the
events: a generation's end says the first step its workers were seen at and when
(first_seen_step, first_seen_t: the step rate), and when their heartbeats last moved
(last_beat_t: a hang or an unfinished job costs the time from then); a recovery says
the step of the workers' first heartbeat (first_step: its step less the beats before
it, exact for a script that beats once per step), so that the steps done again are
the step reached before the fault against it. Times are wall-clock (the agent's
clock's wall(), which stamps the events too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...core.clock import Clock
from ...core.config.component_specs import ObservePart
from ...core.errors import StoreUnavailable
from ...core.observe.badput.node import LiveBeats
from ...core.observe.events import Event
from ...core.observe.repairs import RepairError, RepairNote
from ...core.observe.status import NodeStatus, status_period
from ...core.observe.through import ThroughNote
from ...core.rendezvous.decisions import Outcome
from ...core.rendezvous.place import Place
from ...core.rendezvous.protocol import StoreKeys
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK
from .events import EVENTS, emit
from .metrics_file import MetricsFile
from .metrics_http import MetricsServer

# A local worker's global rank and its heartbeat (count, step), None before its first:
# what the observer reads of a running generation (Generation.beats()).
WorkerBeat = tuple[int, tuple[int, int] | None]


@dataclass(frozen=True)
class _Recovery:
    """A recovery whose end (the new workers' first step) is not seen yet."""

    from_generation: int
    cause: str
    ended_at: float  # the failed generation's end (the agent's clock)
    started_at: float  # the new workers' start
    lost_steps: int


class Observer:
    def __init__(
        self,
        part: ObservePart,
        run_log_dir: str,
        agent: str,
        nproc: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """clock: durations (a generation's, a recovery's); its wall clock stamps the
        events, the heartbeats seen and the status records."""
        self._clock = clock
        EVENTS.start(agent, clock.wall)
        if part.observe.events:
            EVENTS.open(run_log_dir, agent)
        self._metrics: MetricsFile | None = None
        self._server: MetricsServer | None = None
        observe = part.observe
        if observe.metrics_file or observe.metrics_port is not None:
            self._metrics = MetricsFile(observe.metrics_file, part.run_id, agent, clock)
            EVENTS.listen(self._metrics.on_event)
        if self._metrics is not None and observe.metrics_port is not None:
            self._server = MetricsServer(agent, observe.metrics_port, self._metrics.exposition)
        self._started = clock.now()
        self._status_due = 0.0  # when the next status record is due (rtrain status)
        # the generation that ended last: (number, outcome, when, newest step committed)
        self._ended: tuple[int, Outcome, float, int | None] | None = None
        self._recovering: _Recovery | None = None
        self._beats = _Beats(clock.wall)
        self._agent = agent
        self._repair: RepairNote | None = None  # this node's last repair (rtrain status)
        self._stragglers: dict[int, tuple[float, float]] = {}  # rank -> (slower, since)
        self._snapshot_s = 0.0  # this generation's workers' seconds in rtrain.snapshot()
        EVENTS.listen(self._on_event)
        emit(
            "agent_start",
            nproc=nproc,
            run_id=part.run_id,
            backend=part.backend,
            max_restarts=part.max_restarts,
        )

    def _on_event(self, event: Event) -> None:
        if event.name == "repair" and event.agent == self._agent:
            with contextlib.suppress(RepairError):
                self._repair = RepairNote.from_fields(event.fields)
        elif event.name == "repair_lost" and event.agent == self._agent:
            rank, repaired = event.fields.get("rank"), self._repair
            if repaired is not None and isinstance(rank, int):  # kept, then lost
                self._repair = repaired.lose(rank)
        elif event.name in ("straggler", "straggler_cleared") and event.agent == self._agent:
            self._on_straggler(event)

    def _on_straggler(self, event: Event) -> None:
        """Its ranks found slow, for its status record (rtrain status)."""
        rank = event.fields.get("rank")
        if not isinstance(rank, int):
            return
        if event.name == "straggler_cleared":
            self._stragglers.pop(rank, None)
        else:
            self._stragglers[rank] = (float(event["slower"]), float(event["since"]))

    def generation_started(
        self,
        place: Place,
        world_size: int,
        restored_step: int | None,
        warm_up_wait_s: float = 0.0,
    ) -> None:
        self._started = self._clock.now()
        self._status_due = 0.0
        self._beats = _Beats(self._clock.wall)
        self._stragglers = {}
        self._snapshot_s = 0.0
        emit(
            "generation_start",
            nodes=place.num_nodes,
            world_size=world_size,
            members=[m.addr for m in place.membership.members],
            restored_step=restored_step,
            warm_up_wait_s=round(warm_up_wait_s, 3),
        )
        self._end_recovery(None)  # a generation that ended before its first step
        if self._ended is None or self._ended[1] is Outcome.SUCCEEDED:
            return
        number, outcome, when, last_step = self._ended
        lost = 0
        if last_step is not None:
            lost = last_step - (restored_step if restored_step is not None else -1)
        self._recovering = _Recovery(
            number, outcome.name.lower(), when, self._started, max(lost, 0)
        )

    def _end_recovery(
        self, first_step: int | None, beats: Sequence[WorkerBeat] | None = None
    ) -> None:
        """The `recovery` event: down until the first step (None: none seen, so until
        the workers' start)."""
        recovery, self._recovering = self._recovering, None
        if recovery is None:
            return
        end = self._clock.now() if first_step is not None else recovery.started_at
        emit(
            "recovery",
            from_generation=recovery.from_generation,
            cause=recovery.cause,
            down_s=round(end - recovery.ended_at, 6),
            lost_steps=recovery.lost_steps,
            at_step=first_step,
            first_step=None if beats is None or first_step is None else _first_beat_step(beats),
        )

    def generation_ended(
        self,
        generation: int,
        beats: Sequence[WorkerBeat],
        outcome: Outcome,
        last_step: int | None,
    ) -> None:
        """beats: the generation's heartbeats as it ended (Generation.beats())."""
        self._end_recovery(_first_step(beats), beats)
        self._beats.see(beats)
        now = self._clock.now()
        self._ended = (generation, outcome, now, last_step)
        seen = self._beats
        emit(
            "generation_end",
            outcome=outcome.name.lower(),
            seconds=round(now - self._started, 6),
            last_step=last_step,
            reached_step=_newest_beat(beats),
            first_seen_step=seen.first_step,
            first_seen_t=seen.first_t,
            last_beat_t=seen.last_t,
            snapshot_s=round(self._snapshot_s, 6),
        )

    def snapshots_took(self, seconds: float) -> None:
        """This generation's workers spent this long in rtrain.snapshot() (the slowest's,
        read as it ends: agent/observe/stragglers.py): generation_end's snapshot_s."""
        self._snapshot_s = max(self._snapshot_s, seconds)

    def sample(
        self, beats: Sequence[WorkerBeat], committed: int | None, replicated: int | None
    ) -> None:
        """Fresh readings for the metrics file, when it wants them (every few seconds);
        the end of a recovery, at the workers' first step. beats: Generation.beats()."""
        self._beats.see(beats)
        if self._recovering is not None:
            step = _first_step(beats)
            if step is not None:
                self._end_recovery(step, beats)
        if self._metrics is None or not self._metrics.due():
            return
        seen = LiveBeats(self._beats.first_t, self._beats.last_t)
        self._metrics.sample(_newest_beat(beats), committed, replicated, seen)

    def publish_status(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        place: Place,
        beats: Sequence[WorkerBeat],
        committed: int | None,
        replicated: int | None,
        through: ThroughNote | None = None,
    ) -> None:
        """This node's status record for `rtrain status`, every status_period (longer past
        64 nodes: the job's status writes stay flat as it grows): one small
        write, whose failure is left to the lease watch that reports a lost store."""
        now = self._clock.now()
        if now < self._status_due:
            return
        self._status_due = now + status_period(place.num_nodes)
        steps = [_step(beat) for _, beat in beats]
        ranks = tuple(rank for rank, _ in beats)
        record = NodeStatus(
            self._clock.wall(),
            "running",
            ranks,
            tuple(steps),
            committed,
            replicated,
            self._repair,
            through,
            tuple((r, *v) for r, v in sorted(self._stragglers.items())),
        )
        with contextlib.suppress(StoreUnavailable):
            store.set(keys.status(place.generation, place.node_rank), record.encode())

    def job_ended(self, exit_code: int, message: str) -> None:
        self._end_recovery(None)
        emit("job_end", exit_code=exit_code, message=message)

    def close(self) -> None:
        EVENTS.close()
        if self._server is not None:
            self._server.close()


class _Beats:
    """This generation's heartbeats as the agent saw them (wall-clock times, rounded):
    the first step seen and when, and when the beats last moved."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self.first_step: int | None = None
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._counts: tuple[int, ...] = ()

    def see(self, beats: Sequence[WorkerBeat]) -> None:
        counts = tuple(0 if b is None else b[0] for _, b in beats)
        now = round(self._wall(), 6)
        if counts != self._counts and any(counts):
            self._counts, self.last_t = counts, now
        if self.first_step is None:
            self.first_step = _first_step(beats)
            if self.first_step is not None:
                self.first_t = now


def _first_beat_step(beats: Sequence[WorkerBeat]) -> int | None:
    """The step of the workers' first heartbeat of this generation, the earliest of
    theirs: each one's step less the beats it made before (exact for a script that
    beats once per step; never below 0)."""
    firsts = [max(b[1] - b[0] + 1, 0) for _, b in beats if b is not None and b[0] > 0 and b[1] >= 0]
    return min(firsts, default=None)


def _newest_beat(beats: Sequence[WorkerBeat]) -> int | None:
    """The newest step a local worker's heartbeat gave in this generation, or None."""
    steps = [_step(b) for _, b in beats]
    return max((s for s in steps if s is not None), default=None)


def _first_step(beats: Sequence[WorkerBeat]) -> int | None:
    """The newest step a local worker of this generation gave in a heartbeat it made
    (the files start zeroed), or None: none stepped yet."""
    steps = [b[1] for _, b in beats if b is not None and b[0] > 0 and b[1] >= 0]
    return max(steps, default=None)


def _step(beat: tuple[int, int] | None) -> int | None:
    """The step of a heartbeat (count, step); None before the first or without a step."""
    # count 0: the file as created (zeroed), no heartbeat yet: not step 0
    return beat[1] if beat is not None and beat[0] > 0 and beat[1] >= 0 else None
