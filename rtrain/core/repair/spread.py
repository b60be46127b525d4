"""One rule for the work a missing rank leaves, wherever rtrain reroutes it (ReCycle's
rerouting): its units go, one at a time in the order given, each to the present rank
whose load per unit of speed would be least after taking it; a tie goes to the first
present rank after the unit's owner round the ring, so that two neighbours' losses do
not land on one peer. Used for the logical data ranks of a train-through job
(core/repair/shares.py) and for a failed pipeline worker's micro-batches over its
stage's peers (core/planner/plan.py's reroute). Pure."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

U = TypeVar("U", bound=Hashable)


class SpreadError(ValueError):
    """Nothing to spread the work over, or a speed that is not positive."""


def spread(
    missing: Sequence[tuple[int, U]],
    load: Mapping[int, float],
    ring: int,
    speed: Mapping[int, float] | None = None,
) -> dict[U, int]:
    """unit -> the present rank that takes it. missing: (owner, unit) pairs, placed in
    this order; load: each present rank's load (in units) before; ring: the number of
    positions round the ring (the world, or the data-parallel degree); speed: relative
    speeds (1.0 when absent)."""
    if not load:
        raise SpreadError("no rank is present to take the work")
    loads = {rank: float(units) for rank, units in load.items()}
    rates = {rank: float((speed or {}).get(rank, 1.0)) for rank in loads}
    if any(rate <= 0 for rate in rates.values()):
        raise SpreadError("a present rank's speed must be positive")
    ranks = sorted(loads)
    placed: dict[U, int] = {}
    for owner, unit in missing:

        def cost(rank: int, owner: int = owner) -> tuple[float, int]:
            return ((loads[rank] + 1) / rates[rank], (rank - owner) % ring)

        target = min(ranks, key=cost)
        loads[target] += 1
        placed[unit] = target
    return placed
