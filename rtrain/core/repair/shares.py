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

from collections.abc import Mapping, Sequence


class ShareError(ValueError):
    """An assignment asked of no present rank, or of ranks outside the logical world."""


def assign_shares(
    world: int, present: Sequence[int], speed: Mapping[int, float] | None = None
) -> dict[int, tuple[int, ...]]:
    """present rank -> the logical ranks it holds, each in ascending order. Every present
    rank keeps its own; each missing logical rank (ascending) goes to the present rank
    whose load, in logical ranks per unit of speed, would be least after taking it; a tie
    goes to the first present rank after the missing one, counting round the ring (so
    that two neighbours' losses do not land on one peer). speed: relative speeds (1.0
    when absent), for a slow rank's share to shrink (core/repair: issue 49's use)."""
    ranks = sorted(set(present))
    if not ranks:
        raise ShareError("no rank is present to hold the data shares")
    if ranks[0] < 0 or ranks[-1] >= world:
        raise ShareError(f"present ranks {ranks} lie outside a logical world of {world}")
    rates = {r: float((speed or {}).get(r, 1.0)) for r in ranks}
    if any(rate <= 0 for rate in rates.values()):
        raise ShareError("a present rank's speed must be positive")
    held: dict[int, list[int]] = {r: [r] for r in ranks}
    for missing in (r for r in range(world) if r not in held):

        def cost(rank: int, missing: int = missing) -> tuple[float, int]:
            after = (rank - missing) % world  # 1 for the next rank round the ring
            return ((len(held[rank]) + 1) / rates[rank], after)

        held[min(ranks, key=cost)].append(missing)
    return {rank: tuple(sorted(logical)) for rank, logical in held.items()}


def holder_of(shares: Mapping[int, Sequence[int]]) -> dict[int, tuple[int, int]]:
    """logical rank -> (its holder, its place among the holder's logical ranks)."""
    found: dict[int, tuple[int, int]] = {}
    for rank, logical in shares.items():
        for index, one in enumerate(logical):
            found[one] = (rank, index)
    return found
