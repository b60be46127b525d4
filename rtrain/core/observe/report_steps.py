"""What failures cost in time and steps, from the heartbeats the agents saw: the step
time, the start-up, each incident's downtime and steps done again, and how the job
ended (an unfinished job's tail). Pure: events in, numbers out, on the events' clock
(seconds from the report's origin). core/observe/report.py says the definitions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .events import Event


@dataclass(frozen=True)
class GenerationEnd:
    """One node's generation_end: its step counts from the heartbeats (None: unknown)."""

    agent: str
    generation: int | None
    t: float
    outcome: str
    reached: int | None  # the newest step its workers' heartbeats gave
    first_seen: int | None  # the first step the agent saw them at...
    first_seen_t: float | None  # ...and when
    last_beat_t: float | None  # when their heartbeats last moved


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: object, origin: float) -> float | None:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None if number is None else float(number) - origin


def generation_end(event: Event, origin: float) -> GenerationEnd:
    first_seen = _int(event.get("first_seen_step"))
    last_beat_t = _time(event.get("last_beat_t"), origin)
    reached = _int(event.get("reached_step"))
    if first_seen is None and last_beat_t is None:
        # no heartbeat seen: older agents read the zeroed heartbeat file as step 0
        reached = None
    return GenerationEnd(
        event.agent,
        event.generation,
        event.t - origin,
        str(event["outcome"]),
        reached,
        first_seen,
        _time(event.get("first_seen_t"), origin),
        last_beat_t,
    )


def heartbeat_step_time(ends: Iterable[GenerationEnd]) -> float | None:
    """Seconds per step while the workers stepped: steps over the time between the first
    and the newest step each generation's workers were seen at; None: no heartbeats."""
    seconds, steps = 0.0, 0
    for end in ends:
        if None in (end.reached, end.first_seen, end.first_seen_t, end.last_beat_t):
            continue
        assert end.reached is not None and end.first_seen is not None
        assert end.first_seen_t is not None and end.last_beat_t is not None
        if end.reached > end.first_seen and end.last_beat_t > end.first_seen_t:
            seconds += end.last_beat_t - end.first_seen_t
            steps += end.reached - end.first_seen
    return seconds / steps if steps else None


@dataclass(frozen=True)
class Cost:
    down_s: float | None  # from the fault to the first step after it
    steps: int | None  # steps done again; None: unknown
    exact: bool  # False: down_s is a lower bound (to the next start, no step seen)


def incident_cost(
    t_fault: float,
    ends: list[GenerationEnd],
    next_start: float | None,
    recoveries: list[Event],
    restored: int | None,
    origin: float,
    step_s: float | None,
) -> Cost:
    """An incident's cost: `ends` are its generation's ends on every node, `recoveries`
    the next generation's (every node that came back), `restored` the step its
    snapshot restore resumed after (None: none). With no next generation (the job
    ended there: its unfinished tail counts the time) nothing: Cost(None, None, True)."""
    if next_start is None:
        return Cost(None, None, True)
    reached = [e.reached for e in ends if e.reached is not None]
    before = min(reached) if reached else None  # the step every node had reached
    seen = [
        (r.t - origin, _int(r.get("at_step")), _int(r.get("first_step")))
        for r in recoveries
        if _int(r.get("at_step")) is not None
    ]
    firsts = [first for _, _, first in seen if first is not None]
    first = min(firsts) if firsts else (restored + 1 if restored is not None else None)
    steps = None if before is None or first is None else max(before - first + 1, 0)
    if steps is None and before is None and restored is not None:
        lost = [_int(r.get("lost_steps")) for r in recoveries]
        known = [n for n in lost if n is not None]
        steps = max(known) if known else None
    if seen and len(seen) == len(recoveries):
        # the job steps again once every node does: the last node's first step seen,
        # less the steps its workers had made by then
        t_seen, at_step, first_step = max(seen, key=lambda item: item[0])
        made = 0 if at_step is None or first_step is None else max(at_step - first_step, 0)
        if made and step_s is None:
            return Cost(None if next_start is None else next_start - t_fault, steps, False)
        back = max(t_seen - made * (step_s or 0.0), next_start or t_seen)
        return Cost(max(back - t_fault, 0.0), steps, True)
    return Cost(None if next_start is None else next_start - t_fault, steps, False)


@dataclass(frozen=True)
class Ending:
    text: str  # how the job ended
    unfinished: bool
    tail_from: float | None  # an unfinished job: its last step (or its last start)
    end: float | None  # when the last agent ended


def job_ending(job_ends: list[Event], last: list[GenerationEnd], origin: float) -> Ending:
    """How the job ended (its agents' exit codes and messages) and, if unfinished, from
    when its time after the last step is lost. `last`: its last generation's ends."""
    if not job_ends:
        return Ending("no job_end event: still running, or its agents died", False, None, None)
    codes = {e.agent: _int(e.get("exit_code")) for e in job_ends}
    end = max(e.t for e in job_ends) - origin
    if all(code == 0 for code in codes.values()):
        return Ending("succeeded (exit 0 on every node)", False, None, end)
    distinct = set(codes.values())
    if len(distinct) == 1:
        (code,) = distinct
        how = f"exit {code} on every node"
    else:
        how = ", ".join(f"exit {code} on {agent}" for agent, code in sorted(codes.items()))
    message = next((str(e.get("message")) for e in job_ends if e.get("exit_code") != 0), "")
    steps = [e.last_beat_t for e in last if e.last_beat_t is not None]
    tail_from = max(steps) if steps else None
    return Ending(f"unfinished: {how}" + (f" ({message})" if message else ""), True, tail_from, end)


def first_step_at(
    starts: dict[int, float],
    restored_at: dict[int, int],
    ends: list[GenerationEnd],
    step_s: float | None,
) -> float:
    """The start-up: from the first event to the first generation's first step (`starts`:
    generation -> its first start; `restored_at`: the step each resumed after; `ends`:
    the generations' ends): its workers' first heartbeat seen, less the steps they had
    made by then at the step time (never before the generation's start); without a
    heartbeat, or the step time where steps were made, to its start."""
    if not starts:
        return 0.0
    first = min(starts)
    start = starts[first]
    index = restored_at.get(first, -1) + 1  # the generation's first step
    seen = [
        (e.first_seen_t, e.first_seen - index)
        for e in ends
        if e.generation == first and e.first_seen_t is not None and e.first_seen is not None
    ]
    if not seen:
        return start
    t_seen, made = min(seen)
    if made > 0 and step_s is None:
        return start
    return max(t_seen - max(made, 0) * (step_s or 0.0), start)
