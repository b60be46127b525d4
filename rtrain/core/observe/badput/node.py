"""Badput by cause: every second of a node's time, from its agent's start to its end,
put down to exactly one cause, from the events its agent wrote (events.py). Pure:
events in, windows and seconds per cause out, on the events' clock (unix seconds).
job.py merges the nodes' windows into the job's.

A node's time runs in generations. Each generation has an entry (from the agent's start,
or the previous generation's end, to its workers' first step: the rendezvous, a
restore, the workers' start), its training (its first step to its last: the workers'
heartbeats) and its exit (its last step to its end). The causes:

- training: from a generation's first step (when the agent first saw a heartbeat step
  of its workers: it reads them every monitor interval, so up to that late) to its last
  (when their heartbeats last moved); a generation that succeeded, to its end (the
  script's own end), and after the node's last generation that succeeded, to the
  agent's end (the exit barrier). Steps later done again count here: the report's
  goodput takes them out, this split does not;
- startup: the entry of a node's first generation (its store, first rendezvous and
  workers' start up to their first step), and all of a node's time if it never joined
  a generation (a spare never used);
- rendezvous: the entry and exit of a generation that moved on without a fault (a
  membership change: a node joined or left in good order);
- restart: the exit and the next entry of a generation that ended in a fault (any
  node's `fault` event for it, or its own local_failure or gpu_fault) and was not
  repaired in place: stopping the workers, the back-off, the rejoin, the new workers'
  start up to their first step; after the node's last such generation, to its end;
- hang_wait: the exit of a generation in which a worker hung (a `fault` of kind hang,
  on any node): from the last heartbeat step to the generation's end, the time the hang
  timeout waited (the victims' ranks stop stepping with the hung one);
- repair: the exit and the next entry of a generation repaired in place (a `repair`
  event for it, on any node), instead of restart;
- restore: each `restore` event's seconds, up to the event (inside an entry);
- reduced_size: from a `train_through` event to its generation's `full_size` on the
  node (or its last step), inside training;
- straggler: from a `straggler` event's `since` (or its time) to a `straggler_cleared`
  for the same rank in the same generation (or the generation's last step), inside
  training; no agent writes these events yet, so it is 0 until one does;
- snapshot_overhead: a generation_end's `snapshot_s` (seconds its workers' steps spent
  in snapshot(), the slowest rank's), placed at the end of its training, which the
  events say only as an amount; no agent writes that field yet, so it is 0 until one
  does.

A generation without any heartbeat step known (a script that never calls
rtrain.heartbeat(step), or one that never stepped) trained from its start to its end
if it succeeded, another followed it or it is still running (the events cannot say
less, as the report's lower bound); else (an unfinished job's last, a lost node's) it
is all entry: nothing says it made progress.

Overlaps: each cause above is a claim on a span of time; where claims overlap the
first cause in PRECEDENCE takes the instant, so every second goes to one cause and
the seconds add up to the time exactly. Inside a node the only overlaps are restore
over its entry and reduced_size, straggler and snapshot_overhead over training; the
job's merge (job.py) uses the same order across nodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..events import Event
from .causes import (
    HANG_WAIT,
    REDUCED_SIZE,
    RENDEZVOUS,
    REPAIR,
    RESTART,
    RESTORE,
    SNAPSHOT_OVERHEAD,
    STARTUP,
    STRAGGLER,
    TRAINING,
    Claim,
)

# the events the accounting reads (a live node keeps only these)
ACCOUNTED = frozenset(
    {
        "agent_start",
        "generation_start",
        "generation_end",
        "restore",
        "recovery",
        "fault",
        "repair",
        "train_through",
        "full_size",
        "straggler",
        "straggler_cleared",
        "job_end",
    }
)
FAILED_OUTCOMES = frozenset({"local_failure", "gpu_fault"})


@dataclass(frozen=True)
class JobFacts:
    """What a node's windows need to know of the job: the generations that ended in a
    fault, that hung, that were repaired in place; when each lost node stopped (its
    lease's last renewal); each generation's first step (the latest node's)."""

    failed: frozenset[int] = frozenset()
    hung: frozenset[int] = frozenset()
    repaired: frozenset[int] = frozenset()
    lost: dict[str, float] = field(default_factory=dict)
    first_steps: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, events: Iterable[Event]) -> JobFacts:
        failed: set[int] = set()
        hung: set[int] = set()
        repaired: set[int] = set()
        lost: dict[str, float] = {}
        first_steps: dict[int, float] = {}
        for event in events:
            gen = _int(event.generation)
            if event.name == "fault" and gen is not None:
                failed.add(gen)
                if event.get("kind") == "hang":
                    hung.add(gen)
                if event.get("kind") == "lost_node" and _number(event.get("fault_t")):
                    host = str(event.get("host"))
                    lost[host] = max(lost.get(host, 0.0), float(event["fault_t"]))
            elif event.name == "generation_end" and gen is not None:
                if event.get("outcome") in FAILED_OUTCOMES:
                    failed.add(gen)
                first = event.get("first_seen_t")
                if _number(first):
                    first_steps[gen] = max(first_steps.get(gen, float(first)), float(first))
            elif event.name == "repair" and _int(event.get("from_generation")) is not None:
                repaired.add(int(event["from_generation"]))
        return cls(frozenset(failed), frozenset(hung), frozenset(repaired), lost, first_steps)


@dataclass(frozen=True)
class LiveBeats:
    """A running generation's heartbeats as its agent sees them (wall clock): its first
    step seen and when they last moved; None: not yet."""

    first_t: float | None
    last_t: float | None


@dataclass
class _Gen:
    number: int | None
    start: float
    entry: float  # when its entry began: the agent's start or the previous end
    previous: _Gen | None  # the life's previous generation (None: its first)
    end: float | None = None
    outcome: str | None = None  # None: no generation_end (running, or lost)
    first_step: float | None = None
    last_step: float | None = None
    snapshot_s: float = 0.0
    recovered_at: float | None = None  # its `recovery`: the first step, seen


@dataclass
class _Life:
    """One run of a node's agent: from its start to its job_end (or its loss)."""

    start: float
    gens: list[_Gen] = field(default_factory=list)
    end: float | None = None
    last_t: float = 0.0
    overlays: list[tuple[str, float, float | None, int, str]] = field(default_factory=list)
    restores: list[Claim] = field(default_factory=list)

    @property
    def open(self) -> _Gen | None:
        return self.gens[-1] if self.gens and self.gens[-1].end is None else None


def node_claims(
    events: Sequence[Event], end: float, facts: JobFacts, live: LiveBeats | None = None
) -> list[Claim]:
    """One node's claims from its events (one agent's, in time order) up to `end` (the
    report's end; a life without job_end runs to it, or to its loss). live: its running
    generation's heartbeats, where the events do not say them yet."""
    if not events:
        return []
    lives = _lives(events)
    claims: list[Claim] = []
    for index, life in enumerate(lives):
        stop = _life_end(life, index == len(lives) - 1, facts.lost.get(events[0].agent), end)
        for gen in life.gens:
            if gen.end is None:
                gen.end = stop
        current = live if index == len(lives) - 1 else None
        claims += _life_claims(life, max(stop, life.start), facts, current)
    return [c for c in claims if min(c.end, end) > c.start]


def _life_end(life: _Life, newest: bool, lost: float | None, end: float) -> float:
    """Its job_end; else, if its agent started again, its last event (it died there);
    else its loss (its lease's last renewal, as the node that declared it said), or
    `end`: still running."""
    if life.end is not None:
        return life.end
    if not newest:
        return life.last_t
    if lost is not None and lost >= life.start:
        return max(lost, life.last_t)
    return end


def _lives(events: Sequence[Event]) -> list[_Life]:
    lives: list[_Life] = []
    for event in events:
        if event.name == "agent_start" or not lives or lives[-1].end is not None:
            lives.append(_Life(event.t))
        life = lives[-1]
        life.last_t = max(life.last_t, event.t)
        _fold(life, event)
    return lives


def _fold(life: _Life, event: Event) -> None:
    gen, t = life.open, event.t
    if event.name == "generation_start":
        if gen is not None:  # no generation_end came (its agent went on regardless)
            gen.end = t
        previous = life.gens[-1] if life.gens else None
        entry = previous.end if previous is not None and previous.end is not None else life.start
        life.gens.append(_Gen(_int(event.generation), t, min(entry, t), previous))
    elif event.name == "generation_end" and gen is not None:
        _ended(gen, event)
    elif event.name == "recovery" and gen is not None and event.get("at_step") is not None:
        gen.recovered_at = t
    elif event.name == "restore" and _number(event.get("seconds")):
        seconds = max(float(event["seconds"]), 0.0)
        life.restores.append(Claim(RESTORE, t - seconds, t, _int(event.generation), True))
    elif event.name in ("train_through", "straggler") and gen is not None:
        since = _float(event.get("since")) if event.name == "straggler" else None
        start = t if since is None else since
        cause = REDUCED_SIZE if event.name == "train_through" else STRAGGLER
        life.overlays.append((cause, start, None, len(life.gens) - 1, str(event.get("rank"))))
    elif event.name in ("full_size", "straggler_cleared") and gen is not None:
        cause = REDUCED_SIZE if event.name == "full_size" else STRAGGLER
        rank = str(event.get("rank")) if cause == STRAGGLER else "None"
        _close_overlay(life, cause, rank, t)
    elif event.name == "job_end":
        life.end = t
        if gen is not None:  # it ended without its generation's end (a signal, an abort)
            gen.end = t


def _ended(gen: _Gen, event: Event) -> None:
    gen.end = event.t
    gen.outcome = str(event.get("outcome"))
    snapshot = event.get("snapshot_s")
    gen.snapshot_s = max(float(snapshot), 0.0) if _number(snapshot) else 0.0
    first_t, last_t = event.get("first_seen_t"), event.get("last_beat_t")
    if not _number(first_t):
        return
    # when the agent first saw a step (not less the steps made before it, as the
    # report's start-up: a live node's counters, which see the same moment, would
    # then have counted that time under the entry's cause already)
    gen.first_step = max(float(first_t), gen.start)
    gen.last_step = float(last_t) if _number(last_t) else gen.first_step


def _close_overlay(life: _Life, cause: str, rank: str, t: float) -> None:
    for i, (kind, start, stop, gen, who) in enumerate(life.overlays):
        if kind == cause and stop is None and gen == len(life.gens) - 1 and who == rank:
            life.overlays[i] = (kind, start, t, gen, who)


def _life_claims(life: _Life, end: float, facts: JobFacts, live: LiveBeats | None) -> list[Claim]:
    claims = [c for c in life.restores if c.start < end]
    if not life.gens:
        return [*claims, Claim(STARTUP, life.start, end, None, True)]
    spans: list[tuple[float, float] | None] = []
    for index, gen in enumerate(life.gens):
        assert gen.end is not None
        entry = STARTUP if gen.previous is None else _recovery_cause(gen.previous, facts)
        claims.append(Claim(entry, gen.entry, gen.start, gen.number, True))
        followed = index < len(life.gens) - 1
        span = _steps(gen, facts, None if followed else live, followed)
        spans.append(span)
        if span is None:
            claims.append(Claim(entry, gen.start, gen.end, gen.number))
            continue
        first, last = span
        claims.append(Claim(entry, gen.start, first, gen.number))
        claims.append(Claim(TRAINING, first, last, gen.number))
        claims.append(Claim(_exit_cause(gen, facts), last, gen.end, gen.number))
        if gen.snapshot_s:
            start = max(last - gen.snapshot_s, first)
            claims.append(Claim(SNAPSHOT_OVERHEAD, start, last, gen.number))
    last_gen = life.gens[-1]
    assert last_gen.end is not None
    tail = TRAINING if last_gen.outcome == "succeeded" else _recovery_cause(last_gen, facts)
    claims.append(Claim(tail, last_gen.end, end, last_gen.number))
    for cause, start, stop, index, _ in life.overlays:
        span = spans[index]
        if span is not None:  # inside its generation's training, never past it
            until = span[1] if stop is None else min(stop, span[1])
            claims.append(Claim(cause, max(start, span[0]), until, life.gens[index].number))
    return claims


def _steps(
    gen: _Gen, facts: JobFacts, live: LiveBeats | None, followed: bool
) -> tuple[float, float] | None:
    """(first step, last step) of a generation, within it; None: it never trained.
    followed: another generation of its node's life followed it."""
    assert gen.end is not None
    first, last = gen.first_step, gen.last_step
    if first is None and live is not None and live.first_t is not None and gen.outcome is None:
        first, last = live.first_t, live.last_t
    if first is None:
        first = gen.recovered_at
    if first is None and gen.number is not None:
        first = facts.first_steps.get(gen.number)
        last = None
    if first is None:
        trained = gen.outcome == "succeeded" or (gen.outcome is not None and followed)
        running = gen.outcome is None and gen.number not in facts.failed
        return (gen.start, gen.end) if trained or running else None
    if last is None:
        last = gen.end
    first = min(max(first, gen.start), gen.end)
    return first, min(max(last, first), gen.end)


def _exit_cause(gen: _Gen, facts: JobFacts) -> str:
    """From a generation's last step to its end."""
    if gen.outcome == "succeeded" or gen.outcome is None:
        return TRAINING  # its script's own end; still running: nothing ended it yet
    if gen.number in facts.hung:
        return HANG_WAIT
    return _recovery_cause(gen, facts)


def _recovery_cause(gen: _Gen, facts: JobFacts) -> str:
    """What the time after a generation ended goes to, up to the next one's first step."""
    if gen.number in facts.repaired:
        return REPAIR
    if gen.number in facts.failed or gen.outcome in FAILED_OUTCOMES or gen.outcome is None:
        return RESTART
    return RENDEZVOUS


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    """A finite number's value; None for anything else (null, text, NaN, a bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _number(value: object) -> bool:
    return _float(value) is not None
