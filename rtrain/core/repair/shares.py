"""Data shares: which logical data ranks each present worker holds (ReCycle's rerouting,
for data parallelism). A job has a fixed number of logical ranks (the world size it was
launched with); each holds a fixed share of every step's data, by its number. While a
rank is missing (its replacement warms up) its share is done by a present peer, so the
step's global batch and sample order are those of a run without the fault.

Pure: the assignment is a function of the logical world, the ranks present and (for
slow ranks) each one's relative speed; every worker computes it alike, so none has to
send it. tests/unit/core/test_shares.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from .spread import SpreadError, spread


class ShareError(ValueError):
    """An assignment asked of no present rank, or of ranks outside the logical world."""


def assign_shares(
    world: int, present: Sequence[int], speed: Mapping[int, float] | None = None
) -> dict[int, tuple[int, ...]]:
    """present rank -> the logical ranks it holds, each in ascending order. Every present
    rank keeps its own; the missing logical ranks (ascending) are spread by rtrain's one
    rerouting rule (core/repair/spread.py: each to the present rank whose load, in
    logical ranks per unit of speed, would be least after taking it; a tie to the first
    present rank after the missing one round the ring, so that two neighbours' losses do
    not land on one peer), as a failed pipeline worker's micro-batches are. speed:
    relative speeds (1.0 when absent), for the missing ranks' shares to go to the faster
    ones; to move a slow rank's own share off it, balance_shares."""
    ranks = sorted(set(present))
    if not ranks:
        raise ShareError("no rank is present to hold the data shares")
    if ranks[0] < 0 or ranks[-1] >= world:
        raise ShareError(f"present ranks {ranks} lie outside a logical world of {world}")
    held: dict[int, list[int]] = {r: [r] for r in ranks}
    missing = [(r, r) for r in range(world) if r not in held]  # owned by their own rank
    try:
        placed = spread(missing, dict.fromkeys(ranks, 1), world, speed)
    except SpreadError as exc:
        raise ShareError(str(exc)) from None
    for logical, rank in placed.items():
        held[rank].append(logical)
    return {rank: tuple(sorted(logical)) for rank, logical in held.items()}


def holder_of(shares: Mapping[int, Sequence[int]]) -> dict[int, tuple[int, int]]:
    """logical rank -> (its holder, its place among the holder's logical ranks)."""
    found: dict[int, tuple[int, int]] = {}
    for rank, logical in shares.items():
        for index, one in enumerate(logical):
            found[one] = (rank, index)
    return found


def balance_shares(
    world: int, present: Sequence[int], speed: Mapping[int, float]
) -> dict[int, tuple[int, ...]]:
    """present rank -> the logical ranks it holds, in proportion to its speed: the
    counts that make the slowest rank's load (logical ranks per unit of speed) least,
    each rank holding at least one (a slow rank's share may shrink below its own). Each
    rank keeps the first of the logical ranks assign_shares gives it (the same ranks as
    without a plan, as far as its count goes); the others go, ascending, to the ranks
    short of their count, ascending. Which rank holds a logical rank changes no result
    (average_gradients sums in logical order): only the time each step takes."""
    base = assign_shares(world, present)
    ranks = sorted(base)
    rates = {r: float(speed.get(r, 1.0)) for r in ranks}
    if any(rate <= 0 for rate in rates.values()):
        raise ShareError("a present rank's speed must be positive")
    if world < len(ranks):
        raise ShareError(f"{len(ranks)} ranks cannot each hold one of {world} logical ranks")
    counts = {r: 1 for r in ranks}
    heap = [(2 / rates[r], r) for r in ranks]
    heapq.heapify(heap)
    for _ in range(world - len(ranks)):
        _, rank = heapq.heappop(heap)
        counts[rank] += 1
        heapq.heappush(heap, ((counts[rank] + 1) / rates[rank], rank))
    held = {r: list(base[r][: counts[r]]) for r in ranks}
    spare = sorted(one for r in ranks for one in base[r][counts[r] :])
    for rank in ranks:
        while len(held[rank]) < counts[rank]:
            held[rank].append(spare.pop(0))
    return {rank: tuple(sorted(logical)) for rank, logical in held.items()}
