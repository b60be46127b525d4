"""What a finished (or running) job's events say: each node's generations, faults and
recoveries on one time line, snapshot replication throughput over time, and per
failure the time and steps it cost; and the run's goodput. Pure: events in, a Report
out (`rtrain report` draws and prints it).

Definitions (the report's table says them too); every time is seconds on the events'
clock (wall-clock, from the first event), in the table as in the timeline:
- an incident: a generation that ended in failures, under its root cause (the failure
  report's rule); the others are counted with it;
- its downtime: from its first fault (for a hang: the worker's last heartbeat) to the
  first step of the next generation (the step of the workers' first heartbeat, at the
  run's step time before the agent saw it); without heartbeats, to the next
  generation's start, a lower bound;
- its steps done again: the step the job had reached before the fault (its heartbeats:
  the slowest node's newest step) against the first step after it; from the snapshot
  restored where no heartbeat says; unknown (never 0) where neither does;
- the step time: from the heartbeats, steps over the time between the first and the
  last step each generation's workers were seen at; else from the generations whose
  first step is known;
- an unfinished job (a node's agent exited other than 0) costs the time from the last
  step of its last generation to its end (from that generation's start where no
  heartbeat said a step: nothing says it made progress), and the report says how it
  ended;
- the start-up: from the first event (an agent's start) to the first generation's first
  step (its workers' first heartbeat, less the steps made by then at the step time);
  without heartbeats, to that generation's start;
- a repair in place (the `repair` event: rtrain.repairable workers): its incident says
  which ranks kept their processes and which were restarted, and each node's lane
  marks when it repaired;
- a reduced-size stretch (train through a fault, rtrain.repairable(train_through=True)):
  on a node, from its `train_through` event (its kept ranks train on while the new ones
  start up) to its `full_size` of the same generation, else to its generation's end (or
  the generation's first fault), else to the report's end; the job's, per generation,
  from the earliest node's start to the latest's end, at kept / (kept + joining) ranks;
  its cost, reduced throughput: its seconds x joining / world, full-size training not
  done; its own cause, not lost time (goodput counts the stretch as trained);
- the wall time by cause (training, start-up, rendezvous, restore, restart, hang wait,
  repair, reduced size, straggler, snapshot overhead): every second to one cause, as
  core/observe/badput.py defines them; its training share counts steps later done again;
- goodput: the wall time, from the first event to the job's end, less the start-up,
  the downtime, the steps done again at the step time and an unfinished job's tail,
  over the wall time (a job that never stepped: 0); an upper bound where something
  lost is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..rendezvous.failures import FailureKind, FailureRecord, root_cause_first
from .badput.job import Badput, job_badput
from .events import Event
from .repairs import RepairError, RepairNote, merge
from .report_steps import (
    Ending,
    GenerationEnd,
    first_step_at,
    generation_end,
    heartbeat_step_time,
    incident_cost,
    job_ending,
)
from .report_through import Reduced, reduced_stretches


@dataclass(frozen=True)
class Span:
    generation: int | None
    start: float  # seconds from the report's origin
    end: float
    outcome: str  # generation_end's outcome; "running" if none came


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str
    label: str


@dataclass
class NodeLine:
    agent: str
    generations: list[Span] = field(default_factory=list)
    down: list[Span] = field(default_factory=list)  # recovery: from the end to the restart
    faults: list[Mark] = field(default_factory=list)  # when each on this node happened
    detections: list[Mark] = field(default_factory=list)  # when this node noticed it
    replication: list[tuple[float, float]] = field(default_factory=list)  # (t, MB/s)
    repairs: list[Mark] = field(default_factory=list)  # when this node repaired in place


@dataclass(frozen=True)
class FailureRow:
    t: float
    generation: int | None
    kind: str
    where: str
    detect_s: float | None
    time_lost_s: float | None  # downtime: from the fault to the first step after it
    steps_lost: int | None  # steps done again; None: unknown
    also: int  # other faults of the same generation (a root cause's consequences)
    exact: bool = True  # False: time_lost_s is a lower bound (no heartbeat said more)
    repair: RepairNote | None = None  # repaired in place (None: every process restarted)


@dataclass
class Report:
    origin: float  # unix time of the first event
    nodes: list[NodeLine]
    failures: list[FailureRow]
    wall_s: float
    final_step: int | None
    step_s: float | None  # mean seconds per step while training
    goodput: float | None
    bad_lines: int = 0
    ended: str = ""  # how the job ended, from its agents' job_end events
    goodput_bound: bool = False  # goodput is an upper bound: something lost is unknown
    redone_s: float = 0.0  # the steps done again, at the step time
    repairs: dict[int, RepairNote] = field(default_factory=dict)  # by from_generation
    startup_s: float = 0.0  # from the first event to the first step (the start-up)
    restored: dict[int, int] = field(default_factory=dict)  # generation -> snapshot step
    committed: int | None = None  # the newest snapshot step committed, where said
    generations: int = 0  # how many generations started
    reduced: list[Reduced] = field(default_factory=list)  # trained through faults at reduced size
    badput: Badput | None = None  # the wall time by cause (core/observe/badput.py)


def build_report(events: Iterable[Event], bad_lines: int = 0) -> Report:
    ordered = sorted(events, key=lambda e: e.t)
    if not ordered:
        return Report(0.0, [], [], 0.0, None, None, None, bad_lines)
    fold = _Fold(ordered[0].t)
    for event in ordered:
        fold.add(event)
    origin, lines, ends = fold.origin, fold.lines, fold.ends
    end = ordered[-1].t - origin
    fold.close_unended(end)
    last_gen = max((e.generation for e in ends if e.generation is not None), default=None)
    ending = job_ending(fold.job_ends, [e for e in ends if e.generation == last_gen], origin)
    last_end = max((s.end for ln in lines.values() for s in ln.generations), default=end)
    last_end = max(last_end, ending.end or last_end)
    wall = max(last_end, 0.0)  # from the first event, the origin of every time shown
    step_s = heartbeat_step_time(ends) or fold.trained_step_time()
    startup = first_step_at(fold.starts, fold.restored_at, fold.ends, step_s)
    repairs = merge(fold.notes)
    steps = (ends, fold.restored_at, step_s)
    rows = _incidents(fold.faults, origin, fold.starts, fold.recoveries, steps)
    rows = [replace(row, repair=_repaired(repairs, row.generation)) for row in rows]
    if ending.unfinished:
        start = None if last_gen is None else fold.starts.get(last_gen)
        rows.append(_tail_row(ending, last_gen, start, last_end))
    redone, goodput, bound = _goodput(rows, wall, step_s, ending.unfinished, startup)
    report = Report(origin, list(lines.values()), rows, wall, fold.final_step, step_s, goodput)
    report.bad_lines, report.ended, report.goodput_bound = bad_lines, ending.text, bound
    report.redone_s, report.repairs, report.startup_s = redone, repairs, startup
    report.restored, report.committed = dict(fold.restored_at), fold.committed
    report.generations = len(fold.starts)
    report.reduced = reduced_stretches(
        ordered, origin, {a: ln.generations for a, ln in lines.items()}, end
    )
    report.badput = job_badput(ordered, origin, origin + wall)
    return report


@dataclass
class _Fold:
    """What build_report gathers from the events, taken in time order (t: seconds from
    origin, the first event's time)."""

    origin: float
    lines: dict[str, NodeLine] = field(default_factory=dict)
    # agent -> (generation, start, restored step) of its generation under way
    open_at: dict[str, tuple[int | None, float, int | None]] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)  # generation -> first start anywhere
    recoveries: dict[int, list[Event]] = field(default_factory=dict)  # by generation into
    restored_at: dict[int, int] = field(default_factory=dict)  # generation -> step resumed after
    trained_s: float = 0.0  # the generations whose first and last steps are known
    trained_steps: int = 0
    final_step: int | None = None
    committed: int | None = None  # the newest snapshot step committed (generation_end)
    faults: list[Event] = field(default_factory=list)
    ends: list[GenerationEnd] = field(default_factory=list)
    job_ends: list[Event] = field(default_factory=list)
    notes: list[RepairNote] = field(default_factory=list)
    noted: dict[tuple[str, object], int] = field(default_factory=dict)  # (agent, gen) -> note

    def add(self, event: Event) -> None:
        line = self.lines.setdefault(event.agent, NodeLine(event.agent))
        t = event.t - self.origin
        if event.name == "generation_start":
            self._started(event, t)
        elif event.name == "generation_end" and event.agent in self.open_at:
            self._ended(event, line, t)
        elif event.name == "job_end":
            self.job_ends.append(event)
        elif event.name == "recovery":
            down = float(event["down_s"])
            line.down.append(Span(event.get("from_generation"), t - down, t, "down"))
            if event.generation is not None:
                self.recoveries.setdefault(event.generation, []).append(event)
        elif event.name == "fault":
            self.faults.append(event)
            what, kind = _where(event), str(event["kind"])
            where = self.lines.get(str(event["host"]), line)  # its node's lane, if it has one
            where.faults.append(Mark(float(event["fault_t"]) - self.origin, kind, what))
            line.detections.append(Mark(t, kind, what))  # the node that noticed it
        elif event.name == "repair":
            self._repair(event, line, t)
        elif event.name == "repair_lost":
            self._lost(event)
        elif event.name == "replication":
            seconds = float(event["seconds"])
            if seconds > 0:
                line.replication.append((t, float(event["full_bytes"]) / seconds / 1e6))

    def _started(self, event: Event, t: float) -> None:
        self.open_at[event.agent] = (event.generation, t, event.get("restored_step"))
        if event.generation is not None:
            self.starts[event.generation] = min(self.starts.get(event.generation, t), t)
            if isinstance(event.get("restored_step"), int):
                self.restored_at[event.generation] = int(event["restored_step"])

    def _ended(self, event: Event, line: NodeLine, t: float) -> None:
        generation, start, restored = self.open_at.pop(event.agent)
        line.generations.append(Span(generation, start, t, str(event["outcome"])))
        end = generation_end(event, self.origin)
        committed = event.get("last_step")
        if isinstance(committed, int):
            self.committed = max(self.committed if self.committed is not None else -1, committed)
        last = end.reached if end.reached is not None else committed
        first = restored if isinstance(restored, int) else -1 if generation == 0 else None
        if isinstance(last, int) and first is not None:
            self.trained_s += t - start
            self.trained_steps += max(last - first, 0)
        if isinstance(last, int):
            self.final_step = max(self.final_step if self.final_step is not None else -1, last)
        self.ends.append(end)

    def _repair(self, event: Event, line: NodeLine, t: float) -> None:
        try:
            note = RepairNote.from_fields(event.fields)
        except RepairError:  # not what rtrain writes: left out
            return
        self.noted[(event.agent, note.from_generation)] = len(self.notes)
        self.notes.append(note)
        if note.kept or note.job_fallback:  # a node that kept none restarted its own
            line.repairs.append(Mark(t, "repair", note.describe()))

    def _lost(self, event: Event) -> None:
        """A rank the node's repair kept, lost before the hand-over: not kept after all."""
        generation, rank = event.get("from_generation"), event.get("rank")
        at = self.noted.get((event.agent, generation))
        if at is not None and isinstance(rank, int):
            self.notes[at] = self.notes[at].lose(rank)

    def close_unended(self, end: float) -> None:
        """A generation with no end is still running, or its node died: then the others
        declared it lost, and its lease's last renewal is when it stopped."""
        died = {
            (e["host"], e.generation): float(e["fault_t"]) - self.origin
            for e in self.faults
            if e["kind"] == "lost_node"
        }
        for agent, (generation, start, _) in self.open_at.items():
            stop = died.get((agent, generation))
            outcome = "running" if stop is None else "lost"
            span = Span(generation, start, max(stop or end, start), outcome)
            self.lines[agent].generations.append(span)

    def trained_step_time(self) -> float | None:
        """Seconds a step, from the generations whose first and last steps are known."""
        return self.trained_s / self.trained_steps if self.trained_steps else None


def _goodput(
    rows: list[FailureRow], wall: float, step_s: float | None, unfinished: bool, startup: float
) -> tuple[float, float | None, bool]:
    """The steps done again at the step time, the goodput, and whether it is an upper
    bound (something lost unknown). rows: the incidents, an unfinished job's tail last."""
    down = startup + sum(row.time_lost_s or 0.0 for row in rows)
    redone = sum(row.steps_lost or 0 for row in rows) * (step_s or 0.0)
    # an upper bound where a recovery's steps are unknown, or its time only bounded
    bound = any(
        not row.exact or (row.steps_lost is None and row.time_lost_s is not None)
        for row in rows[: len(rows) - unfinished]
    )
    bound = bound or (step_s is None and any(row.steps_lost for row in rows))
    bound = bound and down + redone < wall  # nothing left to bound: no step was kept
    goodput = max(wall - down - redone, 0.0) / wall if wall > 0 else None
    return redone, goodput, bound


def _tail_row(
    ending: Ending, generation: int | None, start: float | None, end: float
) -> FailureRow:
    """An unfinished job's last generation: the time from its last step to the end; from
    its start where no heartbeat said a step (nothing says it made any progress)."""
    since = ending.tail_from
    if since is None:
        since = end if start is None else start
    kind = ending.text.split(" (")[0]
    lost = max(end - since, 0.0)
    return FailureRow(since, generation, kind, "the job", None, lost, None, 0)


def _repaired(repairs: dict[int, RepairNote], generation: int | None) -> RepairNote | None:
    return None if generation is None else repairs.get(generation)


def _where(event: Event) -> str:
    rank = event.get("rank")
    node = event.get("fault_node")
    host = event.get("host")
    who = f"rank {rank}" if rank is not None else "the node"
    return f"{who} on node {node} ({host})"


def _record(event: Event) -> FailureRecord | None:
    try:
        kind = FailureKind(event["kind"])
    except ValueError:  # not a kind rtrain writes
        return None
    node = event.get("fault_node")
    return FailureRecord(
        kind=kind,
        generation=event.generation if event.generation is not None else -1,
        node_rank=node if isinstance(node, int) else -1,
        host=str(event["host"]),
        time=float(event["fault_t"]),
        rank=event.get("rank"),
        message=str(event["message"]),
    )


def _incidents(
    faults: list[Event],
    origin: float,
    starts: dict[int, float],
    recoveries: dict[int, list[Event]],
    steps: tuple[list[GenerationEnd], dict[int, int], float | None],
) -> list[FailureRow]:
    """One row per generation that ended in failures: its root cause (the failure
    report's rule: the earliest fault that is not a worker dying of a peer's broken
    collective), from the first fault to the next generation's first step (`steps`: the
    generations' ends, the snapshot step each resumed after, the step time)."""
    ends, restored_at, step_s = steps
    by_generation: dict[int | None, list[tuple[FailureRecord, Event]]] = {}
    seen: set[tuple[object, ...]] = set()
    for event in faults:
        record = _record(event)
        key = (event.generation, event["kind"], event["fault_node"], event["rank"])
        if record is None or key in seen:  # one failure, however many nodes reported it
            continue
        seen.add(key)
        by_generation.setdefault(event.generation, []).append((record, event))
    rows = []
    for gen, found in by_generation.items():
        root = root_cause_first([record for record, _ in found])[0]
        event = next(e for r, e in found if r is root)
        t = min(r.time for r, _ in found) - origin
        later = sorted(g for g in starts if gen is not None and g > gen)
        cost = incident_cost(
            t,
            [e for e in ends if e.generation == gen],
            starts[later[0]] if later else None,
            recoveries.get(later[0], []) if later else [],
            restored_at.get(later[0]) if later else None,
            origin,
            step_s,
        )
        detect = event.get("detect_s")
        rows.append(
            FailureRow(
                t,
                gen,
                str(root.kind),
                _where(event),
                float(detect) if isinstance(detect, (int, float)) else None,
                cost.down_s,
                cost.steps,
                len(found) - 1,
                cost.exact,
            )
        )
    return sorted(rows, key=lambda row: row.t)
