"""A live node's own view of its time by cause (its --metrics-file and --metrics-port
counters): its own events alone, up to the newest instant no event still to come can
put under another cause. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..events import Event
from .causes import CAUSES, STARTUP, resolve, seconds_by_cause
from .node import JobFacts, LiveBeats, node_claims


def node_split(events: Sequence[Event], live: LiveBeats | None = None) -> dict[str, float]:
    """A node's own view (its events alone: the facts it knows), up to its newest
    settled instant (settled_end); all zeros before it has one."""
    ordered = sorted(events, key=lambda e: e.t)
    end = settled_end(ordered, live)
    if end is None:
        return dict.fromkeys(CAUSES, 0.0)
    claims = node_claims(ordered, end, JobFacts.of(ordered), live)
    return seconds_by_cause(resolve(claims, ordered[0].t, end, STARTUP))


def settled_end(events: Sequence[Event], live: LiveBeats | None = None) -> float | None:
    """The newest instant whose cause no event still to come changes, on a node's own
    view: a running generation's newest heartbeat step (before its first, its start:
    a generation whose workers never step settles at its end); a failed generation's
    last step until the next generation starts (the faults, the repair and the restore
    that say what the recovery was come before that start); else the newest event."""
    if not events:
        return None
    newest = max(e.t for e in events)
    ends = [e for e in events if e.name in ("generation_start", "generation_end", "job_end")]
    if not ends or ends[-1].name == "job_end":
        return newest
    last = ends[-1]
    if last.name == "generation_start":
        beats = [live.last_t, live.first_t] if live is not None else []
        seen = [t for t in beats if t is not None and t >= last.t]
        recovered = [e.t for e in events if e.name == "recovery" and e.t >= last.t]
        return max(seen + recovered, default=last.t)
    if last.get("outcome") == "succeeded":
        return newest
    step = _float(last.get("last_beat_t"))
    start = next((e.t for e in reversed(events) if e.name == "generation_start"), last.t)
    return start if step is None else max(min(step, last.t), start)


def _float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
