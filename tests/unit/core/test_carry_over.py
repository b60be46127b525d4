"""Shards carried over a generation that restored nothing (core/snapshots/carry_over.py):
the plan is made over the ranks that generation's grid gave each older shard."""

from __future__ import annotations

from rtrain.core.layout.topology import Layout, NodeSlot, Topology, build_grid, recompute_topology
from rtrain.core.snapshots.carry_over import carried_ranks, carry_over, fill_in
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


def _partial_relabel() -> tuple[tuple[Topology, Topology], dict[int, list[ShardId]]]:
    """Generation 0: a b c. c lost: generation 1 is a b, and ends in its restore: a
    relabelled rank 0's shard of step 5 into generation 1, b was lost before saying it
    had done its own. Generation 2: a and the standby s, which takes b's place. Node 0
    (a) holds every rank's shards of generation 0 (--snapshot-copies=3), steps 4 and 5."""
    grid0 = build_grid(LAYOUT, 0, _slots("a", "b", "c"))
    grid1 = recompute_topology(LAYOUT, 1, _slots("a", "b"), grid0)
    grid2 = recompute_topology(LAYOUT, 2, _slots("a", "s"), grid1)
    older = [ShardId(0, rank, step) for rank in (0, 1, 2) for step in (4, 5)]
    return (grid1, grid2), {0: [*older, ShardId(1, 0, 5)], 1: []}


def test_a_generation_that_ended_in_its_restore_is_filled_in_from_the_older_one() -> None:
    (grid1, grid2), held = _partial_relabel()
    # before: generation 1's shards alone, rank 1 continues from rank 0's (a DP peer's)
    before = plan_restore(grid2, held)
    assert before is not None and before[1][1].from_dp_peer
    inventory, real = fill_in(held, 0, [grid1])
    plan = plan_restore(grid2, inventory)
    assert plan is not None
    step, sources = plan
    assert step == 5 and not any(s.from_dp_peer for s in sources.values())
    # the newest generation's shard where it has one, the older one carried where not
    assert real[sources[0].shard] == ShardId(1, 0, 5)
    assert real[sources[1].shard] == ShardId(0, 1, 5)


def test_filling_in_never_mixes_steps() -> None:
    (grid1, grid2), held = _partial_relabel()
    # rank 1's shard of step 5 is gone: step 4 for both, though rank 0 has 5 relabelled
    held[0].remove(ShardId(0, 1, 5))
    inventory, real = fill_in(held, 0, [grid1])
    plan = plan_restore(grid2, inventory)
    assert plan is not None
    step, sources = plan
    assert step == 4
    assert {real[s.shard] for s in sources.values()} == {ShardId(0, 0, 4), ShardId(0, 1, 4)}


def test_a_shard_of_the_later_generation_is_never_replaced_by_a_carried_one() -> None:
    (grid1, _), held = _partial_relabel()
    inventory, real = fill_in(held, 0, [grid1])
    assert sorted(inventory[0], key=str) == sorted(
        [ShardId(1, 0, 4), ShardId(1, 0, 5), ShardId(1, 1, 4), ShardId(1, 1, 5)], key=str
    )
    assert real[ShardId(1, 0, 5)] == ShardId(1, 0, 5)  # its own, not generation 0's
    assert real[ShardId(1, 0, 4)] == ShardId(0, 0, 4)
    assert inventory[1] == []


def test_filling_in_over_skipped_generations_is_carrying_over() -> None:
    grid0 = build_grid(LAYOUT, 0, _slots("a", "b", "c"))
    grid1 = recompute_topology(LAYOUT, 1, _slots("a", "c"), grid0)
    grid2 = recompute_topology(LAYOUT, 2, _slots("a", "c", "s"), grid1)
    held = {0: [ShardId(0, 0, 3), ShardId(0, 1, 3), ShardId(0, 2, 3)], 1: [ShardId(0, 1, 2)]}
    inventory, real = fill_in(held, 0, [grid1, grid2])
    carried, carried_real = carry_over(held, 0, 2, carried_ranks([grid1, grid2]))
    assert {n: set(s) for n, s in inventory.items()} == {n: set(s) for n, s in carried.items()}
    assert real == carried_real
