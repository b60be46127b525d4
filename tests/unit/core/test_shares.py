"""Data shares (core/repair/shares.py), the kept ranks' variable (core/contract/
environment.py) and average_gradients() in one process: pure, no network."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.core.contract.environment import decode_ranks, encode_ranks
from rtrain.core.contract.train_through import joins_late
from rtrain.core.repair.shares import ShareError, assign_shares, holder_of
from rtrain.core.worker import shares
from rtrain.core.worker.repair import through


def test_every_rank_present_holds_its_own_share() -> None:
    assert assign_shares(4, [0, 1, 2, 3]) == {0: (0,), 1: (1,), 2: (2,), 3: (3,)}


def test_a_missing_share_goes_to_the_next_rank_round_the_ring() -> None:
    assert assign_shares(4, [0, 2, 3]) == {0: (0,), 2: (1, 2), 3: (3,)}
    assert assign_shares(4, [0, 1, 2]) == {0: (0, 3), 1: (1,), 2: (2,)}


def test_two_neighbours_lost_land_on_two_peers() -> None:
    held = assign_shares(6, [0, 3, 4, 5])
    assert held == {0: (0,), 3: (1, 3), 4: (2, 4), 5: (5,)}


def test_a_slow_rank_takes_no_extra_share() -> None:
    held = assign_shares(4, [0, 2, 3], speed={2: 0.5})
    assert held[2] == (2,) and sorted(held[0] + held[3]) == [0, 1, 3]


@pytest.mark.parametrize(
    ("world", "present", "speed"),
    [(4, [], None), (4, [4], None), (4, [-1, 0], None), (2, [0], {0: 0.0})],
)
def test_an_impossible_assignment_is_refused(
    world: int, present: list[int], speed: dict[int, float] | None
) -> None:
    with pytest.raises(ShareError):
        assign_shares(world, present, speed)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 64).flatmap(
        lambda w: st.tuples(st.just(w), st.sets(st.integers(0, w - 1), min_size=1))
    )
)
def test_every_logical_rank_is_held_once_and_loads_differ_by_at_most_one(
    case: tuple[int, set[int]],
) -> None:
    world, present = case
    held = assign_shares(world, sorted(present))
    logical = sorted(r for ranks in held.values() for r in ranks)
    assert logical == list(range(world))
    assert all(rank in ranks for rank, ranks in held.items())
    loads = [len(ranks) for ranks in held.values()]
    assert max(loads) - min(loads) <= 1
    where = holder_of(held)
    assert all(held[h][i] == r for r, (h, i) in where.items())


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40))
def test_the_kept_ranks_variable_is_ranks_or_refused(text: str) -> None:
    found = decode_ranks(text)
    if found is not None:
        assert list(found) == sorted(set(found)) and all(r >= 0 for r in found)
        assert decode_ranks(encode_ranks(list(found))) == found


def test_the_kept_ranks_variable_round_trips() -> None:
    assert decode_ranks(encode_ranks([3, 0, 2, 2])) == (0, 2, 3)
    assert decode_ranks("") == () and decode_ranks(None) is None
    assert decode_ranks("1,-2") is None and decode_ranks("1,,2") is None


def test_average_gradients_sums_in_logical_order_as_the_fault_free_run_does() -> None:
    """One process holding logical ranks 0-2 of 3 (no process group: its own rows are
    all of them) gets the mean the whole world's ranks would: summed 0, 1, 2."""
    param = torch.nn.Parameter(torch.zeros(5))
    grads = {r: [torch.randn(5, generator=torch.Generator().manual_seed(r))] for r in range(3)}
    shares.enter(shares.Shares(3, 0, {0: (0, 1, 2)}))
    try:
        shares.average_gradients([param], grads)
        with pytest.raises(ValueError, match="holds"):
            shares.average_gradients([param], {0: grads[0]})
    finally:
        shares.leave()
    expected = grads[0][0].clone()
    expected += grads[1][0]
    expected += grads[2][0]
    assert torch.equal(param.grad, expected / 3)


def test_without_rtrain_a_worker_holds_its_own_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert shares.data_ranks() == (3,) and shares.data_world_size() == 8


@pytest.mark.parametrize(
    ("env", "joins"),
    [
        ({"RTRAIN_KEPT_RANKS": "0,2,3", "WORLD_SIZE": "4", "RANK": "1"}, True),
        ({"RTRAIN_KEPT_RANKS": "0,2,3", "WORLD_SIZE": "4", "RANK": "2"}, False),
        ({"RTRAIN_KEPT_RANKS": "0,1", "WORLD_SIZE": "2", "RANK": "1"}, False),  # all kept
        ({"RTRAIN_KEPT_RANKS": "", "WORLD_SIZE": "4", "RANK": "1"}, False),  # a restart
        ({"RTRAIN_KEPT_RANKS": "0,x", "WORLD_SIZE": "4", "RANK": "1"}, False),  # refused
        ({"RTRAIN_KEPT_RANKS": "0", "WORLD_SIZE": "four", "RANK": "1"}, False),
        ({"WORLD_SIZE": "4", "RANK": "1"}, False),
    ],
)
def test_a_new_worker_joins_late_only_beside_kept_ranks(env: dict[str, str], joins: bool) -> None:
    assert joins_late(env) is joins


def test_a_fresh_process_named_kept_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept rank's place taken by a new process (the kept one lost at the hand-over)
    must not train through as if it had the kept state: it fails, and is repaired."""
    monkeypatch.setenv("RTRAIN_KEPT_RANKS", "0,2,3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    assert through.role(True, repaired=True) is None  # no data world: --tp/--pp above 1
    monkeypatch.setenv("RTRAIN_DATA_WORLD", "4")
    assert through.role(True, repaired=True) is through.Role.KEPT
    with pytest.raises(through.TrainThroughError, match="new one"):
        through.role(True, repaired=False)
    assert through.role(False, repaired=False) is None  # not asked for: as before
    monkeypatch.setenv("RANK", "1")
    assert through.role(True, repaired=False) is through.Role.NEW
