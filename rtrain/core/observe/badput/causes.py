"""The causes a node's (and the job's) time is put down to, in the order that decides
an instant two claims overlap on, and the cut of a span of time into one cause a
window. Pure. node.py says what each cause covers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TRAINING = "training"
STARTUP = "startup"
RENDEZVOUS = "rendezvous"
RESTORE = "restore"
RESTART = "restart"
HANG_WAIT = "hang_wait"
REPAIR = "repair"
REDUCED_SIZE = "reduced_size"
STRAGGLER = "straggler"
SNAPSHOT_OVERHEAD = "snapshot_overhead"

CAUSES = (
    TRAINING,
    STARTUP,
    RENDEZVOUS,
    RESTORE,
    RESTART,
    HANG_WAIT,
    REPAIR,
    REDUCED_SIZE,
    STRAGGLER,
    SNAPSHOT_OVERHEAD,
)
# Highest first: the cause an instant goes to where claims overlap. A hang's wait is
# what holds everything else up; training at reduced size is the job training on
# while its new ranks start (their start-up is the train-through's point); the
# degraded-training causes only ever take training's time.
PRECEDENCE = (
    HANG_WAIT,
    REDUCED_SIZE,
    REPAIR,
    RESTORE,
    RESTART,
    RENDEZVOUS,
    STARTUP,
    STRAGGLER,
    SNAPSHOT_OVERHEAD,
    TRAINING,
)
_RANK = {cause: rank for rank, cause in enumerate(PRECEDENCE)}


@dataclass(frozen=True)
class Window:
    cause: str
    start: float
    end: float


@dataclass(frozen=True)
class Claim:
    """A cause's claim on [start, end); generation: the one it belongs to, or leads
    into (entry: a wait before that generation started; None: never joined one)."""

    cause: str
    start: float
    end: float
    generation: int | None
    entry: bool = False


def resolve(claims: Iterable[Claim], start: float, end: float, fallback: str) -> list[Window]:
    """[start, end) cut into windows, each the highest cause (PRECEDENCE) of the claims
    over it; `fallback` where none claims it. Adjacent windows of one cause are merged;
    their lengths add up to end - start."""
    edges: list[tuple[float, int, int]] = []  # (when, the cause's rank, +1 from, -1 to)
    for claim in claims:
        lo, hi = max(claim.start, start), min(claim.end, end)
        if hi > lo:
            rank = _RANK[claim.cause]
            edges += [(lo, rank, 1), (hi, rank, -1)]
    edges.sort(key=lambda edge: edge[0])
    active = [0] * len(PRECEDENCE)
    windows: list[Window] = []
    t, index = start, 0
    while t < end:
        while index < len(edges) and edges[index][0] <= t:
            active[edges[index][1]] += edges[index][2]
            index += 1
        following = min(edges[index][0], end) if index < len(edges) else end
        cause = next((PRECEDENCE[r] for r, count in enumerate(active) if count), fallback)
        if windows and windows[-1].cause == cause:
            windows[-1] = Window(cause, windows[-1].start, following)
        else:
            windows.append(Window(cause, t, following))
        t = following
    return windows


def seconds_by_cause(windows: Iterable[Window]) -> dict[str, float]:
    """Every cause's seconds (0.0 for those with none), in CAUSES' order."""
    seconds = dict.fromkeys(CAUSES, 0.0)
    for window in windows:
        seconds[window.cause] += window.end - window.start
    return seconds
