"""The DP x PP x TP grid and its recomputation after failures (pure, no processes)."""

from __future__ import annotations

import pytest

from rtrain.core.layout.topology import (
    Layout,
    LayoutError,
    NodeSlot,
    Topology,
    build_grid,
    recompute_topology,
)
from rtrain.core.worker.api import worker_view


def nodes(*sizes: int, prefix: str = "n") -> list[NodeSlot]:
    return [NodeSlot(f"{prefix}{i}", size) for i, size in enumerate(sizes)]


def test_pure_dp_is_one_stage_and_every_rank_a_replica():
    topo = build_grid(Layout(), 0, nodes(2, 2))
    assert topo.dp_size == 4 and topo.world_size == 4
    assert topo.dp_group(3) == (0, 1, 2, 3)
    assert topo.tp_group(2) == (2,) and topo.pp_group(2) == (2,)


def test_tp_fastest_then_pp_then_dp():
    topo = build_grid(Layout(tp=2, pp=2), 0, nodes(4, 4))
    assert topo.dp_size == 2
    coords = [(c.dp, c.pp, c.tp) for c in topo.coords]
    assert coords[:4] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert coords[4:] == [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert topo.tp_group(5) == (4, 5)
    assert topo.pp_group(5) == (5, 7)
    assert topo.dp_group(5) == (1, 5)  # same stage, same TP rank: identical parameters


def test_tp_groups_never_straddle_nodes():
    topo = build_grid(Layout(tp=2), 0, nodes(2, 4, 2))
    for rank in range(topo.world_size):
        assert len({topo.coords[r].node_rank for r in topo.tp_group(rank)}) == 1
    with pytest.raises(LayoutError, match="tensor-parallel group must stay on one node"):
        build_grid(Layout(tp=4), 0, nodes(4, 2))


def test_ranks_past_the_last_whole_replica_are_spares():
    topo = build_grid(Layout(pp=4), 0, nodes(2, 2, 2))
    assert topo.dp_size == 1 and topo.spare_ranks == (4, 5)
    spare = worker_view(topo, 5)
    assert spare.is_spare and spare.dp_group == ()


def test_no_whole_replica_left_is_a_layout_error():
    with pytest.raises(LayoutError, match="a pipeline stage would have no worker"):
        build_grid(Layout(pp=4), 1, nodes(2, 1))


def test_node_loss_shrinks_dp_keeps_stages_and_names_lost_ranks_and_holders():
    before = build_grid(Layout(pp=2), 0, nodes(2, 2, 2))  # DP=3
    after = recompute_topology(Layout(pp=2), 1, [before.nodes[0], before.nodes[2]], before)
    assert after.dp_size == 2 and after.layout.pp == 2
    assert after.lost_ranks == (2, 3)
    # stage 0 was held by ranks 0, 2, 4; rank 2's node is gone
    assert after.previous_holders == {(0, 0): (0, 4), (1, 0): (1, 5)}
    # node n2's new ranks 2, 3 sit at the grid coordinates of the lost ranks 2, 3, so
    # they continue those ranks' state (from replicas), not that of their old ranks 4, 5
    assert after.previous_rank == {0: 0, 1: 1} and after.replaces == {2: 2, 3: 3}
    view = worker_view(after, 3)
    assert (view.dp_rank, view.pp_rank) == (1, 1)
    assert view.previous_stage_holders == (1, 5) and view.lost_ranks == (2, 3)


def test_a_node_rank_shift_never_hands_a_rank_another_stages_state():
    # PP=4 over two nodes; the first node is lost and the survivor becomes node 0: its
    # new ranks 0, 1 are stages 0, 1, so they continue old ranks 0, 1, not its own 2, 3
    before = build_grid(Layout(pp=4), 0, nodes(2, 2))
    after = recompute_topology(Layout(pp=4), 1, [before.nodes[1], NodeSlot("new", 2)], before)
    assert after.previous_rank == {} and after.replaces == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [c.pp for c in after.coords] == [0, 1, 2, 3]


def test_a_new_node_has_no_previous_rank():
    before = build_grid(Layout(), 0, nodes(2))
    after = recompute_topology(Layout(), 1, [*before.nodes, NodeSlot("new", 2)], before)
    assert after.previous_rank == {0: 0, 1: 1} and after.lost_ranks == ()


def test_encode_decode_round_trip_and_refusal():
    before = build_grid(Layout(tp=2), 0, nodes(2, 2))
    topo = recompute_topology(Layout(tp=2), 1, [before.nodes[1]], before)
    again = Topology.decode(topo.encode())
    assert again == topo
    for garbage in ("", "[]", '{"v": 1}', '{"v": 9, "tp": 1}'):
        with pytest.raises(LayoutError, match="unreadable topology"):
            Topology.decode(garbage)
