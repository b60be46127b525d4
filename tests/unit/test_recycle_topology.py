"""The ReCycle plan a recomputed topology carries: positions kept from the previous grid,
the failed set, and the plan over them."""

from __future__ import annotations

import pytest
from rtrain.core.pipeline_job import PlannerError
from rtrain.core.recycle_topology import check_profile, positions, recycle_plan
from rtrain.core.topology import Layout, NodeSlot, build_grid, recompute_topology

LAYOUT = Layout(pp=2)
PROFILE = {
    "microbatches": 4,
    "forward": 1,
    "backward_input": 1,
    "backward_weight": 1,
    "optimizer": 0.1,
}
NODES = [NodeSlot(f"n{i}", 1) for i in range(4)]  # one worker per node: one stage each


def test_survivors_keep_their_place_and_the_lost_one_is_failed() -> None:
    before = build_grid(LAYOUT, 0, NODES)  # DP=2: replica 0 = n0, n1; replica 1 = n2, n3
    after = recompute_topology(LAYOUT, 1, NODES[:3], before)  # n3 (replica 1, stage 1) lost
    where, failed = positions(before, after)
    assert where == {0: (0, 0), 1: (0, 1), 2: (1, 0)} and failed == {(1, 1)}
    plan = recycle_plan(before, after, PROFILE)
    assert plan is not None and plan["failed"] == [[1, 1]] and plan["positions"]["2"] == [1, 0]
    by_worker = {tuple(w["worker"]): w["actions"] for w in plan["workers"]}
    helper = [a for a in by_worker[(0, 1)] if a["op"] == "F"]
    # (0, 1) now runs replica 1's stage-1 forwards too: 4 + 4 per iteration, 2 iterations
    assert len(helper) == 16
    assert {tuple(a["recv_from"]) for a in helper if a["replica"] == 1} == {(1, 0)}


def test_a_replacement_takes_over_the_lost_place_and_nothing_is_planned() -> None:
    before = build_grid(LAYOUT, 0, NODES)
    after = recompute_topology(LAYOUT, 1, [*NODES[:3], NodeSlot("new", 1)], before)
    assert positions(before, after)[1] == set()
    assert recycle_plan(before, after, PROFILE) is None


def test_a_stage_with_no_survivor_gets_no_plan() -> None:
    before = build_grid(LAYOUT, 0, NODES)
    after = recompute_topology(LAYOUT, 1, [NODES[0], NODES[2]], before)  # both stage-1 gone
    assert positions(before, after)[1] == {(0, 1), (1, 1)}
    assert recycle_plan(before, after, PROFILE) is None


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
