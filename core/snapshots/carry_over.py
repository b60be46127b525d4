"""Shards carried over generations that never restored anything. Pure.

plan_restore counts only the previous generation's shards: every generation relabels
the shards it restores into its own. A generation that ended before its restore (a
member lost while it started: the others raise GenerationEnded and rejoin) relabeled
nothing, so the next one finds only older shards. Each skipped generation's grid says
whose state each of its ranks continues (grid_lineage: its own rank before, or the lost
rank it replaced), so an older shard is carried through them to the ranks that would
have held it, and the plan is made as if the skipped generations had restored it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..layout.topology import Topology
from .restore_plan import ShardId, grid_lineage


def carried_ranks(skipped: Sequence[Topology]) -> dict[int, tuple[int, ...]]:
    """Rank of the generation before skipped[0] -> the ranks of the last skipped
    generation that continue its state (none: its state went with a lost node).
    skipped: consecutive generations' grids, each with its lineage to the one before."""
    if not skipped:
        return {}
    first = skipped[0]
    mapping: dict[int, tuple[int, ...]] = {}
    for coord in first.coords:
        own = grid_lineage(first, coord.rank).own
        if own is not None:
            mapping[own] = (*mapping.get(own, ()), coord.rank)
    for topology in skipped[1:]:
        step = carried_ranks([topology])
        mapping = {
            old: tuple(new for mid in mids for new in step.get(mid, ()))
            for old, mids in mapping.items()
        }
    return mapping


def carry_over(
    inventory: Mapping[int, Iterable[ShardId]],
    source: int,
    target: int,
    ranks: Mapping[int, tuple[int, ...]],
) -> tuple[dict[int, list[ShardId]], dict[ShardId, ShardId]]:
    """The inventory with generation `source`'s shards named as generation `target`'s
    (ranks mapped by `ranks`, others left out), and each such name -> the real shard."""
    carried: dict[int, list[ShardId]] = {}
    real: dict[ShardId, ShardId] = {}
    for node, shards in inventory.items():
        carried[node] = []
        for shard in shards:
            if shard.generation != source:
                continue
            for rank in ranks.get(shard.rank, ()):
                name = ShardId(target, rank, shard.step)
                carried[node].append(name)
                real[name] = shard
    return carried, real
