"""The one rerouting rule (core/repair/spread.py), and its two users agreeing on it: the
data shares of train-through and ReCycle's micro-batches of a failed pipeline worker."""

from __future__ import annotations

import pytest

from rtrain.core.planner.job import PipelineJob
from rtrain.core.planner.plan import reroute
from rtrain.core.repair.shares import assign_shares
from rtrain.core.repair.spread import SpreadError, spread


def test_each_unit_goes_to_the_least_loaded_and_a_tie_round_the_ring() -> None:
    # ranks 0, 2, 3 present; 1's two units: the first to 2 (next after 1), then 3
    placed = spread([(1, "a"), (1, "b")], {0: 1, 2: 1, 3: 1}, ring=4)
    assert placed == {"a": 2, "b": 3}
    # rank 3's unit wraps round to 0
    assert spread([(3, "x")], {0: 1, 1: 1, 2: 1}, ring=4) == {"x": 0}


def test_a_faster_rank_takes_more() -> None:
    placed = spread([(2, u) for u in range(4)], {0: 1, 1: 1}, ring=3, speed={0: 3.0})
    assert list(placed.values()) == [0, 0, 0, 0]  # rank 0 at 5 units / 3 still under 2


def test_nothing_present_or_a_bad_speed_is_refused() -> None:
    with pytest.raises(SpreadError):
        spread([(0, "a")], {}, ring=2)
    with pytest.raises(SpreadError):
        spread([(0, "a")], {1: 1}, ring=2, speed={1: 0.0})


@pytest.mark.parametrize("failed", [1, 2, 4])
def test_data_shares_and_pipeline_micro_batches_follow_the_same_rule(failed: int) -> None:
    """One micro-batch per replica: the replica that takes a failed pipeline worker's
    micro-batch is the rank that takes the same logical data rank under train-through."""
    world = 5
    shares = assign_shares(world, [r for r in range(world) if r != failed])
    holder = next(rank for rank, logical in shares.items() if failed in logical and rank != failed)
    job = PipelineJob.uniform(world, 2, 1)
    assignment = reroute(job, frozenset({(failed, 0)}))
    assert assignment[(failed, 0, 0)] == (holder, 0)
    assert assignment[(failed, 0, 1)] == (failed, 1)  # its stage 1 is alive: stays
