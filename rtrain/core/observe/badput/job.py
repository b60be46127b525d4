"""The job's badput by cause: every second of its wall time, from its first event to
its end, put down to one cause (node.py defines them), from every node's events.
Pure: events in, a Badput out (`rtrain report` prints and draws it).

The job's instant goes to the highest cause (causes.PRECEDENCE) any node claims then:
the job trains only while every node does. A node's wait for a generation counts from
the job's previous generation's end (the earliest node's) on, not before: a spare
waiting to be admitted, or a node rejoining, holds nothing up while the others still
train; a node that never joined a generation claims nothing. An instant no node
claims (between a requeued job's runs: no agent ran) is start-up before the job's
first generation started and restart after.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..events import Event
from .causes import RESTART, STARTUP, TRAINING, Claim, Window, resolve, seconds_by_cause
from .node import JobFacts, node_claims


@dataclass
class Badput:
    wall_s: float  # from the first event to the job's end: the seconds below add up to it
    seconds: dict[str, float]  # cause -> seconds, every cause (badput.CAUSES' order)
    goodput: float | None  # training's share of the wall time (None: no time)
    # the job's causes over time, seconds from the first event (the report's clock)
    timeline: list[Window] = field(default_factory=list)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)  # each node's own split


def job_badput(events: Iterable[Event], origin: float, end: float) -> Badput:
    """The job's split of [origin, end] (unix seconds: the report's first event and its
    end), and each node's of its own time."""
    ordered = sorted(events, key=lambda e: e.t)
    facts = JobFacts.of(ordered)
    agents: dict[str, list[Event]] = {}
    for event in ordered:
        agents.setdefault(event.agent, []).append(event)
    since = _waits_count_from(ordered)
    claims: list[Claim] = []
    nodes: dict[str, dict[str, float]] = {}
    for agent, own in agents.items():
        found = node_claims(own, end, facts)
        stop = max((c.end for c in found), default=own[0].t)
        nodes[agent] = seconds_by_cause(resolve(found, own[0].t, min(stop, end), RESTART))
        claims += _relevant(found, since)
    starts = [e.t for e in ordered if e.name == "generation_start"]
    first = min(max(min(starts, default=end), origin), end)
    windows = resolve(claims, origin, first, STARTUP) + resolve(claims, first, end, RESTART)
    timeline = _merged([Window(w.cause, w.start - origin, w.end - origin) for w in windows])
    seconds = seconds_by_cause(timeline)
    wall = max(end - origin, 0.0)
    goodput = seconds[TRAINING] / wall if wall > 0 else None
    return Badput(wall, seconds, goodput, timeline, nodes)


def _waits_count_from(events: list[Event]) -> dict[int, float]:
    """generation -> when a wait for it starts to count for the job: when the job's
    generation before it first ended (no end said: when it first started); the
    job's first generation's, from the start."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for event in events:
        gen = event.generation
        if gen is None:
            continue
        if event.name == "generation_start":
            starts[gen] = min(starts.get(gen, event.t), event.t)
        elif event.name == "generation_end":
            ends[gen] = min(ends.get(gen, event.t), event.t)
    since: dict[int, float] = {}
    ordered = sorted(starts)
    for before, gen in zip([None, *ordered], ordered, strict=False):
        if before is None:
            since[gen] = float("-inf")
        else:
            since[gen] = ends.get(before, starts[gen])
    return since


def _relevant(claims: list[Claim], since: dict[int, float]) -> list[Claim]:
    """The claims that hold the job up: waits for a generation from when they count
    (a wait for one never joined, not at all)."""
    kept = []
    for claim in claims:
        if not claim.entry:
            kept.append(claim)
        elif claim.generation is not None:
            start = max(claim.start, since.get(claim.generation, claim.start))
            if start < claim.end:
                kept.append(Claim(claim.cause, start, claim.end, claim.generation, True))
    return kept


def _merged(windows: list[Window]) -> list[Window]:
    merged: list[Window] = []
    for window in windows:
        if window.end <= window.start:
            continue
        if merged and merged[-1].cause == window.cause and merged[-1].end == window.start:
            merged[-1] = Window(window.cause, merged[-1].start, window.end)
        else:
            merged.append(window)
    return merged
