"""Shards carried over a generation that restored nothing (core/snapshots/carry_over.py):
the plan is made over the ranks that generation's grid gave each older shard."""

from __future__ import annotations

from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.snapshots.carry_over import carried_ranks, carry_over
from rtrain.core.snapshots.restore_plan import ShardId, plan_restore

LAYOUT = Layout(pp=1, tp=1)


def _slots(*names: str) -> list[NodeSlot]:
    return [NodeSlot(name, 1) for name in names]


def test_a_skipped_generation_carries_the_older_shards_to_the_next_plan() -> None:
    # generation 0: a b c; generation 1 (ended as it started): a b c again; generation
    # 2: b was lost, the standby s takes node rank 1. Only generation 0's shards exist.
    grid0 = build_grid(LAYOUT, 0, _slots("a", "b", "c"))
    grid1 = recompute_topology(LAYOUT, 1, _slots("a", "b", "c"), grid0)
    grid2 = recompute_topology(LAYOUT, 2, _slots("a", "s", "c"), grid1)
    ranks = carried_ranks([grid1])
    assert ranks == {0: (0,), 1: (1,), 2: (2,)}
    # node 0 holds rank 0's shards and c's replicas (ring: 2 -> 0), node 2 rank 2's
    # and b's replicas; steps 4 and 5
    held = {
        0: [ShardId(0, 0, 4), ShardId(0, 0, 5), ShardId(0, 2, 4), ShardId(0, 2, 5)],
        1: [],
        2: [ShardId(0, 2, 4), ShardId(0, 2, 5), ShardId(0, 1, 4), ShardId(0, 1, 5)],
    }
    assert plan_restore(grid2, held) is None  # before: nothing of generation 1's
    inventory, real = carry_over(held, 0, 1, ranks)
    plan = plan_restore(grid2, inventory)
    assert plan is not None
    step, sources = plan
    assert step == 5
    assert real[sources[1].shard] == ShardId(0, 1, 5) and sources[1].holders == (2,)
    assert real[sources[0].shard] == ShardId(0, 0, 5)


def test_ranks_carry_through_several_skipped_generations_and_a_shrink() -> None:
    grid0 = build_grid(LAYOUT, 0, _slots("a", "b", "c"))
    # b lost: c closes up to node rank 1, and takes DP position 1 (b's rank's state)
    grid1 = recompute_topology(LAYOUT, 1, _slots("a", "c"), grid0)
    grid2 = recompute_topology(LAYOUT, 2, _slots("a", "c", "s"), grid1)
    ranks = carried_ranks([grid1, grid2])
    assert ranks == {0: (0,), 1: (1,)}  # old rank 2's position is gone; s is new
    held = {0: [ShardId(0, 1, 3), ShardId(0, 2, 3), ShardId(1, 0, 3)]}
    inventory, real = carry_over(held, 0, 2, ranks)
    assert inventory == {0: [ShardId(2, 1, 3)]}
    assert real == {ShardId(2, 1, 3): ShardId(0, 1, 3)}
