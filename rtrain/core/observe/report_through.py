"""The reduced-size stretches of a job that trained through a fault
(rtrain.repairable(train_through=True)): from each node's `train_through` event (its
kept ranks train on at reduced size) to its `full_size` event of the same generation
(the new ranks joined), else to that node's generation's end (its generation_end, the
generation's first fault after it began, a lost node's lease), else to the report's end.
The job's stretch of a generation: from the earliest node's start to the latest node's
end, at the fraction of ranks training then (kept / (kept + joining)). Its cost is its
own cause, reduced throughput, not lost time: the equivalent full-size training seconds
it did not do (its seconds x joining / world). Pure: events in, stretches out, on the
events' clock (seconds from the report's origin); a malformed event is left out.
core/observe/report.py says the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .events import Event
from .through import ThroughError, ThroughNote

# what ended a node's (or the job's) reduced-size stretch
FULL_SIZE = "full size again"
GENERATION_END = "generation ended"
REPORT_END = "still reduced at the report's end"


@dataclass(frozen=True)
class NodeReduced:
    """One node's reduced-size span: its kept ranks trained at reduced size."""

    agent: str
    start: float  # its train_through event
    end: float
    until: str  # FULL_SIZE, GENERATION_END or REPORT_END
    kept: tuple[int, ...]  # the ranks training (the job's, as this node said)
    joining: tuple[int, ...]  # the new ranks starting up meanwhile
    joined: tuple[int, ...] = ()  # this node's new ranks that joined (its full_size)


@dataclass(frozen=True)
class Reduced:
    """The job's reduced-size stretch in one generation, its nodes' spans merged."""

    generation: int
    start: float  # the earliest node's train_through
    end: float  # the latest node's full_size (or generation end)
    seconds: float  # end - start: how long the job trained at reduced size
    ranks: int  # the ranks training: kept
    world: int  # the full size: kept + joining
    # reduced throughput: the full-size training seconds not done, seconds x joining /
    # world; its own cause, not lost time (goodput counts the stretch as trained)
    reduced_throughput_s: float
    until: str  # FULL_SIZE once every node said so, else what ended the latest node's
    nodes: tuple[NodeReduced, ...]

    @property
    def fraction(self) -> float:
        """The share of the full size that trained: ranks / world."""
        return self.ranks / self.world


@dataclass(frozen=True)
class _Full:
    t: float
    joined: tuple[int, ...]


class GenerationSpan(Protocol):
    """A node's generation on the report's time line (report.Span)."""

    @property
    def generation(self) -> int | None: ...
    @property
    def end(self) -> float: ...
    @property
    def outcome(self) -> str: ...  # "running": no end came


def reduced_stretches(
    events: Iterable[Event],
    origin: float,
    generations: Mapping[str, Iterable[GenerationSpan]],
    end: float,
) -> list[Reduced]:
    """The job's reduced-size stretches, by generation. `events`: in time order;
    `generations`: each node's generations (agent -> spans: when each ended, or was
    lost: its lease); `end`: the report's end (seconds from origin)."""
    ends = {
        (agent, span.generation): span.end
        for agent, spans in generations.items()
        for span in spans
        if span.generation is not None and span.outcome != "running"
    }
    started: dict[tuple[str, int], tuple[float, ThroughNote]] = {}
    fulls: dict[tuple[str, int], list[_Full]] = {}
    faults: dict[int, list[float]] = {}
    for event in events:
        generation = event.generation
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            continue
        key = (event.agent, generation)
        t = event.t - origin
        if event.name == "train_through" and key not in started:
            note = _note(event)
            if note is not None:
                started[key] = (t, note)
        elif event.name == "full_size":
            joined = _ranks(event.get("joined"))
            reduced = event.get("reduced_s")
            if joined is not None and (reduced is None or _number(reduced)):
                fulls.setdefault(key, []).append(_Full(t, joined))
        elif event.name == "fault" and _number(event.get("fault_t")):
            faults.setdefault(generation, []).append(float(event["fault_t"]) - origin)
    spans: dict[int, list[NodeReduced]] = {}
    for (agent, generation), (start, note) in started.items():
        stop = _stop(start, ends.get((agent, generation)), faults.get(generation), end)
        full = next((f for f in fulls.get((agent, generation), []) if f.t >= start), None)
        if full is not None and full.t <= stop[0]:
            stop, joined = (full.t, FULL_SIZE), full.joined
        else:
            joined = ()
        node = NodeReduced(agent, start, stop[0], stop[1], note.kept, note.joining, joined)
        spans.setdefault(generation, []).append(node)
    # the full_size of a node that had no kept ranks (its new ones joined) counts too
    joins = [(g, f.t) for (a, g), found in fulls.items() if (a, g) not in started for f in found]
    return [
        _merged(generation, nodes, [t for g, t in joins if g == generation])
        for generation, nodes in sorted(spans.items())
    ]


def _stop(
    start: float, ended: float | None, faults: Sequence[float] | None, end: float
) -> tuple[float, str]:
    """When a node's reduced stretch that no full_size ended stopped: its generation's
    end, or the generation's first fault after the stretch began; else the report's."""
    stops = [t for t in faults or () if t >= start]
    if ended is not None:
        stops.append(ended)
    if not stops:
        return max(end, start), REPORT_END
    return max(min(stops), start), GENERATION_END


def _merged(generation: int, nodes: list[NodeReduced], joins: list[float]) -> Reduced:
    """The job's stretch from its nodes' spans; `joins`: when the generation's nodes
    without a span said it was at full size (the latest such counts once every span
    ended at full size)."""
    kept = {r for n in nodes for r in n.kept}
    world = len(kept | {r for n in nodes for r in n.joining})
    start, stop = min(n.start for n in nodes), max(n.end for n in nodes)
    unjoined = [n for n in nodes if n.until != FULL_SIZE]  # no full size said there
    until = max(unjoined, key=lambda n: n.end).until if unjoined else FULL_SIZE
    if until == FULL_SIZE:
        stop = max([stop, *(t for t in joins if t >= start)])
    seconds = stop - start
    lost = seconds * (world - len(kept)) / world
    ordered = tuple(sorted(nodes, key=lambda n: (n.start, n.agent)))
    return Reduced(generation, start, stop, seconds, len(kept), world, lost, until, ordered)


def _note(event: Event) -> ThroughNote | None:
    """A train_through event's note; None where it is not what rtrain writes (ranks
    that are not ranks, none kept or none joining, a rank both kept and joining)."""
    try:
        note = ThroughNote.from_fields({**event.fields, "since": event.t, "full": False})
    except ThroughError:
        return None
    if not note.kept or not note.joining or set(note.kept) & set(note.joining):
        return None
    return note


def _ranks(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
        return None
    return tuple(value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
