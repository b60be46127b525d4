"""The ReCycle plan a recomputed topology carries: positions kept from the previous grid,
the failed set, and the plan over them."""

from __future__ import annotations

import pytest

from rtrain.core.layout.recycle import (
    PositionsError,
    carried_positions,
    check_profile,
    decode_positions,
    encode_positions,
    failure_plan,
    grid_positions,
    recycle_plan,
    restore_lineage,
)
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.planner.job import PipelineJob, PlannerError
from rtrain.core.planner.scheduler import plan as make_plan
from rtrain.core.planner.sim import simulate
from rtrain.core.snapshots.restore_plan import Lineage, RestoreSource, ShardId, plan_restore
from rtrain.core.worker.recycle import worker_plan

LAYOUT = Layout(pp=2)
PROFILE = {
    "microbatches": 4,
    "forward": 1,
    "backward_input": 1,
    "backward_weight": 1,
    "optimizer": 0.1,
}
NODES = [NodeSlot(f"n{i}", 1) for i in range(4)]  # one worker per node: one stage each


def test_generation_0_gets_the_fault_free_plan_of_its_own_grid() -> None:
    grid = build_grid(LAYOUT, 0, NODES)
    plan = recycle_plan(grid, PROFILE)
    assert plan is not None and plan["failed"] == [] and (plan["dp"], plan["pp"]) == (2, 2)
    assert plan["positions"] == {"0": [0, 0], "1": [0, 1], "2": [1, 0], "3": [1, 1]}
    durations = {k: v for k, v in PROFILE.items() if k != "microbatches"}
    fault_free = make_plan(PipelineJob.from_profile(durations, 2, 2, 4), [], "1f1b")
    assert plan["iteration_time"] == pytest.approx(simulate(fault_free).iteration_time)


def test_survivors_keep_their_place_and_the_lost_one_is_failed() -> None:
    before = build_grid(LAYOUT, 0, NODES)  # DP=2: replica 0 = n0, n1; replica 1 = n2, n3
    after = recompute_topology(LAYOUT, 1, NODES[:3], before)  # n3 (replica 1, stage 1) lost
    where = carried_positions(grid_positions(before), after)
    assert where == {0: (0, 0), 1: (0, 1), 2: (1, 0)}
    plan = recycle_plan(after, PROFILE, before)
    assert plan is not None and plan["failed"] == [[1, 1]] and plan["positions"]["2"] == [1, 0]
    by_worker = {tuple(w["worker"]): w["actions"] for w in plan["workers"]}
    helper = [a for a in by_worker[(0, 1)] if a["op"] == "F"]
    # (0, 1) now runs replica 1's stage-1 forwards too: 4 + 4 per iteration, 2 iterations
    assert len(helper) == 16
    assert {tuple(a["recv_from"]) for a in helper if a["replica"] == 1} == {(1, 0)}


def test_a_second_failure_is_planned_on_the_grid_of_the_first() -> None:
    # rtrain's own grid shrinks to DP=1 after the first loss (n2 becomes a spare), so
    # planning over it would lose replica 1's micro-batches when n2 goes too.
    gen0 = build_grid(LAYOUT, 0, NODES)
    gen1 = recompute_topology(LAYOUT, 1, NODES[:3], gen0)
    plan1 = recycle_plan(gen1, PROFILE, gen0, recycle_plan(gen0, PROFILE))
    gen2 = recompute_topology(LAYOUT, 2, NODES[:2], gen1)
    assert gen2.dp_size == 1
    plan2 = recycle_plan(gen2, PROFILE, gen1, plan1)
    assert plan2 is not None and (plan2["dp"], plan2["pp"]) == (2, 2)
    assert plan2["failed"] == [[1, 0], [1, 1]]
    assert plan2["positions"] == {"0": [0, 0], "1": [0, 1]}
    forwards = [a for w in plan2["workers"] for a in w["actions"] if a["op"] == "F"]
    # every micro-batch of both replicas, at both stages, in each of the 2 iterations
    assert len(forwards) == 2 * 2 * 4 * 2


def test_a_replacement_takes_over_the_lost_place_and_nothing_is_failed() -> None:
    before = build_grid(LAYOUT, 0, NODES)
    after = recompute_topology(LAYOUT, 1, [*NODES[:3], NodeSlot("new", 1)], before)
    plan = recycle_plan(after, PROFILE, before)
    assert plan is not None and plan["failed"] == []
    assert plan["positions"]["3"] == [1, 1]


def test_a_stage_whose_workers_are_all_lost_is_carried_from_replicas() -> None:
    before = build_grid(LAYOUT, 0, NODES)
    after = recompute_topology(LAYOUT, 1, [NODES[0], NODES[2]], before)  # both stage-1 gone
    # n2's worker now sits at stage 1 of the shrunk grid: it continues the lost stage-1
    # rank at that coordinate (from the replica n2 holds), never its own stage-0 state
    assert after.replaces == {1: 1} and after.previous_rank == {0: 0}
    assert set(carried_positions(grid_positions(before), after).values()) == {(0, 0), (0, 1)}
    plan = recycle_plan(after, PROFILE, before)
    assert plan is not None and plan["failed"] == [[1, 0], [1, 1]]


@pytest.mark.parametrize(
    ("profile", "fragment"),
    [
        ([], "expected a JSON object"),
        ({**PROFILE, "microbatches": 0}, "microbatches must be a positive integer"),
        ({k: v for k, v in PROFILE.items() if k != "forward"}, "forward is missing"),
        ({**PROFILE, "forward": [1, 2, 3]}, "forward has 3 values for 2 stages"),
    ],
)
def test_a_bad_profile_is_refused_at_launch(profile, fragment) -> None:
    with pytest.raises(PlannerError) as caught:
        check_profile(profile, 2)
    assert fragment in str(caught.value) and "--recycle-profile" in str(caught.value)


def test_plan_positions_go_through_the_store_and_garbage_is_refused() -> None:
    gen0 = build_grid(LAYOUT, 0, NODES)
    gen1 = recompute_topology(LAYOUT, 1, NODES[:3], gen0)
    plan1 = recycle_plan(gen1, PROFILE, gen0, recycle_plan(gen0, PROFILE))
    assert plan1 is not None
    carried = decode_positions(encode_positions(plan1).encode())
    gen2 = recompute_topology(LAYOUT, 2, NODES[:2], gen1)
    assert recycle_plan(gen2, PROFILE, gen1, carried) == recycle_plan(gen2, PROFILE, gen1, plan1)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"\xff\xfe", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"dp": 0, "pp": 2, "positions": {}}', "positive integers"),
        ('{"dp": 2, "pp": true, "positions": {}}', "positive integers"),
        ('{"dp": 2, "pp": 2, "positions": []}', "must be an object"),
        ('{"dp": 2, "pp": 2, "positions": {"0": [2, 0]}}', "not on the grid"),
        ('{"dp": 2, "pp": 2, "positions": {"x": [0, 0]}}', "not on the grid"),
        ('{"dp": 2, "pp": 2, "positions": {"0": [0]}}', "not on the grid"),
    ],
)
def test_garbage_plan_positions_are_refused(payload, fragment) -> None:
    with pytest.raises(PositionsError) as caught:
        decode_positions(payload)
    assert fragment in str(caught.value)


def test_a_node_that_joins_later_takes_over_the_failed_position() -> None:
    gen0 = build_grid(LAYOUT, 0, NODES)
    gen1 = recompute_topology(LAYOUT, 1, NODES[:3], gen0)  # n3 (1, 1) lost
    plan1 = recycle_plan(gen1, PROFILE, gen0, recycle_plan(gen0, PROFILE))
    assert plan1 is not None and plan1["failed"] == [[1, 1]]
    gen2 = recompute_topology(LAYOUT, 2, [*NODES[:3], NodeSlot("new", 1)], gen1)
    plan2 = recycle_plan(gen2, PROFILE, gen1, plan1)
    assert plan2 is not None and plan2["failed"] == []
    assert plan2["positions"]["3"] == [1, 1]
    # nobody held (1, 1) in generation 1: the newcomer restores a stage-1 DP peer's state
    lineage = restore_lineage(plan1, plan2)
    assert lineage[3] == Lineage(None, (1,))
    assert lineage[1] == Lineage(1, ()) and lineage[0] == Lineage(0, (2,))


def test_a_rank_restores_its_plan_stage_where_the_grid_says_another() -> None:
    gen0 = build_grid(LAYOUT, 0, NODES)
    gen1 = recompute_topology(LAYOUT, 1, [NODES[0], NODES[2], NODES[3]], gen0)  # n1 lost
    plan1 = recycle_plan(gen1, PROFILE, gen0, recycle_plan(gen0, PROFILE))
    assert plan1 is not None
    # n3 is a spare of rtrain's shrunk grid (stage 0 there) but holds (1, 1) in the plan
    assert gen1.coords[2].dp is None and gen1.coords[2].pp == 0
    assert plan1["positions"]["2"] == [1, 1]
    gen2 = recompute_topology(LAYOUT, 2, [NODES[0], NODES[2], NODES[3]], gen1)  # a restart
    plan2 = recycle_plan(gen2, PROFILE, gen1, plan1)
    assert plan2 is not None and plan2["positions"] == plan1["positions"]
    # n3's own shard has no surviving copy: it must take a stage-1 peer's state
    inventory = {0: [ShardId(1, 0, 5), ShardId(1, 1, 5)], 1: [ShardId(1, 1, 5)], 2: []}
    by_grid = plan_restore(gen2, inventory)
    by_plan = plan_restore(gen2, inventory, lineage=restore_lineage(plan1, plan2))
    assert by_grid is not None and by_plan is not None
    assert by_grid[1][2].shard.rank == 0  # stage-0 parameters for a stage-1 worker
    assert by_plan[1][2] == RestoreSource(ShardId(1, 1, 5), (0, 1), True)
    assert by_plan[1][0].shard == ShardId(1, 0, 5) and by_plan[1][1].shard == ShardId(1, 1, 5)


def test_failure_plan_numbers_the_survivors_and_drops_whole_replicas() -> None:
    job = PipelineJob.uniform(3, 2, 4)
    recycle = failure_plan(job, [(1, 0), (2, 1)], "recycle")
    assert recycle["positions"] == {"0": [0, 0], "1": [0, 1], "2": [1, 1], "3": [2, 0]}
    drop = failure_plan(job, [(1, 0), (2, 1)], "drop")
    assert drop["positions"] == {"0": [0, 0], "1": [0, 1]}
    plan = worker_plan(drop, 1)
    assert plan.position == (0, 1) and plan.stage == 1 and plan.replica == 0
    forwards = [a for a in plan.actions if a["op"] == "F" and a["iteration"] == 0]
    assert len(forwards) == 3 * 4  # every replica's micro-batches on the one left
