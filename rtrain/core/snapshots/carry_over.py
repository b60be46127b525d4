"""Shards carried over generations that never restored anything. Pure.

plan_restore counts only the previous generation's shards: every generation relabels
the shards it restores into its own. A generation that ended before its restore (a
member lost while it started: the others raise GenerationEnded and rejoin) relabeled
nothing, so the next one finds only older shards. Each skipped generation's grid says
whose state each of its ranks continues (grid_lineage: its own rank before, or the lost
rank it replaced), so an older shard is carried through them to the ranks that would
have held it, and the plan is made as if the skipped generations had restored it.

A generation can also end in the middle of its restore: some nodes relabelled their
ranks' shards, the others were lost before they did or before saying so. Its shards
are then relabelled copies only (its workers never started), of some of its ranks:
fill_in names it a complete set where one exists, taking per rank and step the newest
generation's shard and the older one carried over where it has none. Steps are never
mixed: a rank's shard of a step is only ever completed with shards of that same step.
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


def fill_in(
    inventory: Mapping[int, Iterable[ShardId]], source: int, later: Sequence[Topology]
) -> tuple[dict[int, list[ShardId]], dict[ShardId, ShardId]]:
    """The inventory named as the last of `later`'s generations, and each name -> the
    real shard: generation `source`'s shards carried through `later` (the grids of the
    generations after it, up to the previous one, each with its lineage to the one
    before) wherever a later generation holds no shard of the same rank and step.

    Only for generations whose shards are relabelled copies (they skipped their
    restore, or ended in it): a shard their workers wrote would make the step of a
    carried one a different state."""
    held = {node: list(shards) for node, shards in inventory.items()}
    named = {
        node: {s: s for s in shards if s.generation == source} for node, shards in held.items()
    }
    for topology in later:
        generation = topology.generation
        ranks = carried_ranks([topology])
        own = {
            (s.rank, s.step)
            for shards in held.values()
            for s in shards
            if s.generation == generation
        }
        for node, shards in held.items():
            moved = {
                ShardId(generation, rank, name.step): real
                for name, real in named[node].items()
                for rank in ranks.get(name.rank, ())
                if (rank, name.step) not in own
            }
            moved.update({s: s for s in shards if s.generation == generation})
            named[node] = moved
    carried = {node: sorted(names, key=_order) for node, names in named.items()}
    real = {name: shard for names in named.values() for name, shard in names.items()}
    return carried, real


def _order(shard: ShardId) -> tuple[int, int, int]:
    return shard.generation, shard.rank, shard.step
