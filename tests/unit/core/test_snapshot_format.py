"""Shard layout, restore planning and replica placement (pure; no processes)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rtrain.agent.snapshots.checksums import checksums, verify
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.snapshots.format import (
    COMMITTED,
    SnapshotError,
    plan_shard,
    read_header,
    read_shard,
    write_shard,
)
from rtrain.core.snapshots.restore_plan import ShardId, plan_restore, ring_successors


def round_trip(state, step=7):
    layout = plan_shard(state)
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return read_shard(buffer)


def test_nested_state_with_plain_values_round_trips_bitwise():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "loader": {"epoch": 3, "offset": 1024, "files": ["a", "b"]},
        "half": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "empty": torch.empty(0, 5),
        "view": torch.arange(10.0)[::2],  # not contiguous
    }
    back, step = round_trip(state)
    assert step == 7
    assert back["loader"] == state["loader"]
    assert torch.equal(back["rng"], state["rng"])
    assert back["half"].dtype == torch.bfloat16 and torch.equal(back["half"], state["half"])
    assert back["empty"].shape == (0, 5) and torch.equal(back["view"], state["view"])
    for key, value in state["model"].items():
        assert torch.equal(back["model"][key], value)
    assert back["optimizer"]["state"][0]["exp_avg"].equal(state["optimizer"]["state"][0]["exp_avg"])


def test_empty_state_round_trips():
    assert round_trip({}) == ({}, 7)


def test_objects_that_cannot_be_kept_are_named():
    with pytest.raises(SnapshotError, match=r"loader\.hook: a function cannot be snapshotted"):
        plan_shard({"loader": {"hook": lambda: None}})


def test_a_shard_whose_writer_died_is_never_read():
    layout = plan_shard({"w": torch.ones(3)})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 5)
    buffer[12:16] = (1).to_bytes(4, "little")  # state back to WRITING, as if killed mid-copy
    assert read_header(buffer).state != COMMITTED
    with pytest.raises(SnapshotError, match="not a complete shard"):
        read_shard(buffer)


def test_checksums_find_a_flipped_bit():
    layout = plan_shard({"w": torch.randn(3_000_000)})  # > one 8 MiB chunk
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 1)
    crcs = checksums(buffer, layout.size)
    assert len(crcs) == 3 and verify(buffer, layout.size, crcs)  # the skeleton, two data chunks
    buffer[layout.size - 3] ^= 0x10
    assert not verify(buffer, layout.size, crcs)


def test_dp_replicas_shards_share_their_data_chunks_whatever_their_skeletons():
    # The same parameters, a per-rank RNG state at the end and a note of another
    # length: the skeletons differ, and so does the last data chunk only.
    weights = torch.randn(5_000_000)
    digests = []
    for rank, note in ((0, "rank 0"), (1, "the rank with a longer note")):
        rng = torch.full((100,), rank, dtype=torch.uint8)
        layout = plan_shard({"model": {"w": weights}, "note": note, "rng": rng})
        buffer = bytearray(layout.size)
        write_shard(buffer, layout, 1)
        digests.append(checksums(buffer, layout.size))
    ours, theirs = digests
    assert len(ours) == len(theirs) == 4
    assert ours[0] != theirs[0] and ours[1:3] == theirs[1:3] and ours[3] != theirs[3]


def test_ring_placement_keeps_copies_on_distinct_nodes():
    assert ring_successors(0, 4, 2) == [1]
    assert ring_successors(3, 4, 3) == [0, 1]
    assert ring_successors(0, 1, 2) == []  # alone: only the original
    assert ring_successors(1, 2, 5) == [0]  # never more copies than nodes


def test_a_replica_goes_against_the_receiving_nodes_dp_twin_of_the_same_stage():
    from rtrain.core.snapshots.redundancy import dp_twin

    ddp = build_grid(Layout(), 0, [NodeSlot("a", 2), NodeSlot("b", 2)])
    assert dp_twin(ddp, 0, 1) == 2 and dp_twin(ddp, 3, 0) == 0
    # PP=2 on nodes of 2: a node holds both stages of one replica, so rank 0 (stage 0)
    # is sent against node 1's stage-0 rank, never its stage-1 one.
    piped = build_grid(Layout(pp=2), 0, [NodeSlot("a", 2), NodeSlot("b", 2)])
    first = next(c for c in piped.coords if c.rank == 0)
    twin = dp_twin(piped, 0, 1)
    assert twin is not None
    assert next(c for c in piped.coords if c.rank == twin).pp == first.pp
    # PP=4 over the same four ranks: no DP peer anywhere, nothing to send against.
    only = build_grid(Layout(pp=4), 0, [NodeSlot("a", 2), NodeSlot("b", 2)])
    assert all(dp_twin(only, r, n) is None for r in range(4) for n in (0, 1))


def nodes(*ids: str) -> list[NodeSlot]:
    return [NodeSlot(i, 2) for i in ids]


def test_plan_prefers_the_newest_step_every_rank_has_its_own_shard_of():
    before = build_grid(Layout(), 0, nodes("a", "b"))
    after = recompute_topology(Layout(), 1, nodes("a", "b"), before)
    inventory = {
        0: [ShardId(0, r, s) for r in (0, 1) for s in (4, 5)] + [ShardId(0, 2, 4)],
        1: [ShardId(0, 2, 4), ShardId(0, 3, 4), ShardId(0, 3, 5)],
    }
    step, plan = plan_restore(after, inventory)
    assert step == 4  # rank 2 has no step 5 anywhere
    assert plan[0].shard == ShardId(0, 0, 4) and plan[0].holders == (0,)
    assert plan[2].holders == (0, 1) and not plan[2].from_dp_peer


def test_plan_gives_a_replacement_node_the_lost_ranks_shards():
    before = build_grid(Layout(), 0, nodes("a", "b"))
    after = recompute_topology(Layout(), 1, nodes("a", "new"), before)
    assert after.replaces == {2: 2, 3: 3}
    inventory = {0: [ShardId(0, r, 9) for r in range(4)], 1: []}
    step, plan = plan_restore(after, inventory)
    assert step == 9 and plan[3].shard == ShardId(0, 3, 9) and not plan[3].from_dp_peer


def test_plan_falls_back_to_a_dp_peer_when_no_copy_of_a_shard_survives():
    before = build_grid(Layout(), 0, nodes("a", "b"))
    after = recompute_topology(Layout(), 1, nodes("a"), before)  # b gone, no replicas
    step, plan = plan_restore(after, {0: [ShardId(0, 0, 3), ShardId(0, 1, 3)]})
    assert step == 3 and not plan[0].from_dp_peer
    grown = recompute_topology(Layout(), 2, nodes("a", "c"), after)
    step, plan = plan_restore(grown, {0: [ShardId(1, 0, 6), ShardId(1, 1, 6)], 1: []})
    assert plan[2].from_dp_peer and plan[2].shard.rank in (0, 1)


def test_plan_is_none_on_a_fresh_start():
    topo = build_grid(Layout(), 0, nodes("a"))
    assert plan_restore(topo, {0: []}) is None


def test_plain_python_and_numpy_state_round_trips_with_its_types():
    import random

    import numpy

    state = {
        0: {"step": torch.tensor(3.0)},
        (1, "a"): [1, 2.5, None, True, "x"],
        "betas": (0.9, 0.999),
        "blob": b"\x00\xffraw",
        "special": [float("inf"), -float("inf")],
        "py_rng": random.getstate(),
        "np_rng": numpy.random.get_state(),
        "array": numpy.arange(6, dtype=numpy.int32).reshape(2, 3),
        "np_scalar": numpy.float32(1.5),
    }
    back, _ = round_trip(state)
    assert back[0]["step"].item() == 3.0
    assert back[(1, "a")] == [1, 2.5, None, True, "x"]
    assert back["betas"] == (0.9, 0.999) and isinstance(back["betas"], tuple)
    assert back["blob"] == b"\x00\xffraw" and back["special"] == state["special"]
    assert back["py_rng"] == state["py_rng"]
    random.setstate(back["py_rng"])  # the restored state is usable as it is
    assert isinstance(back["array"], numpy.ndarray) and (back["array"] == state["array"]).all()
    assert back["np_rng"][0] == "MT19937" and (back["np_rng"][1] == state["np_rng"][1]).all()
    numpy.random.set_state(back["np_rng"])
    assert back["np_scalar"] == 1.5


def planted_shard(meta: bytes, data_len: int = 0) -> bytearray:
    """A committed shard whose skeleton bytes are `meta`, as a forger would write it."""
    from rtrain.core.snapshots.format import HEADER, HEADER_SIZE, MAGIC, VERSION

    buffer = bytearray(HEADER_SIZE + len(meta) + data_len)
    HEADER.pack_into(buffer, 0, MAGIC, VERSION, COMMITTED, 10**9, len(meta), data_len, -1)
    buffer[HEADER_SIZE : HEADER_SIZE + len(meta)] = meta
    return buffer


def test_a_pickled_skeleton_is_refused_and_never_runs(tmp_path):
    import os
    import pickle

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(SnapshotError, match="skeleton refused"):
        read_shard(planted_shard(pickle.dumps({"model": Payload()})))
    assert not marker.exists()


@pytest.mark.parametrize(
    "meta",
    [
        b'{"t":["float32",[4],0,16]}',  # points past the data area
        b'{"t":["load",[1],0,1]}',  # not a dtype
        b'{"t":["float32",[2],0,4]}',  # nbytes does not match the shape
        b'{"x":1}',
        b'{"d":[[{"d":[]},1]]}',  # an unhashable key
        # DTensors: placements off the grammar, a mesh whose ranks do not fill its
        # shape, a shard dimension the tensor lacks, a local shard past the data
        b'{"D":[["float32",[2],0,8],[4],[1],["X"],[2],[0,1],null,"cpu"]}',
        b'{"D":[["float32",[2],0,8],[4],[1],["S0"],[2],[0,0],null,"cpu"]}',
        b'{"D":[["float32",[2],0,8],[4],[1],["S3"],[2],[0,1],null,"cpu"]}',
        b'{"D":[["float32",[64],0,256],[4],[1],["S0"],[2],[0,1],null,"cpu"]}',
        b'{"D":[["float32",[2],0,8],[4],[1],["R"],[1],[0],null,"../x"]}',
        b"[" * 100 + b"]" * 100,
        b"\xff\xfe",
    ],
)
def test_a_forged_skeleton_is_refused_by_shape(meta):
    with pytest.raises(SnapshotError, match="skeleton refused"):
        read_shard(planted_shard(meta))


def test_any_bytes_as_a_skeleton_give_a_state_or_a_refusal():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
    def check(meta):
        with contextlib.suppress(SnapshotError):  # anything else fails the test
            _state, step = read_shard(planted_shard(meta, data_len=64))
            assert step == 10**9

    check()


def test_objects_with_no_plain_form_are_refused_by_key():
    with pytest.raises(SnapshotError, match=r"opt\.groups: a set cannot be snapshotted"):
        plan_shard({"opt": {"groups": {1, 2}}})
    with pytest.raises(SnapshotError, match=r"a numpy array of object"):
        import numpy

        plan_shard({"a": numpy.array([object()])})


def test_a_reused_layout_with_other_plain_values_reads_back_as_a_fresh_plan_does():
    """Fuzzed: a state and another of the same structure whose plain values were drawn
    anew (same types); the second laid out over the first (its skeleton's text with the
    changed values put in) reads back exactly as the second laid out afresh."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    plain = {
        str: st.text(max_size=12),
        int: st.integers(),
        bool: st.booleans(),
        float: st.floats(allow_nan=True, allow_infinity=True),
        type(None): st.none(),
    }
    shapes = st.recursive(
        st.sampled_from([*plain, torch.Tensor]),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=12,
    )

    def fill(shape, data):
        if isinstance(shape, list):
            return [fill(item, data) for item in shape]
        if isinstance(shape, dict):
            return {key: fill(item, data) for key, item in shape.items()}
        if shape is torch.Tensor:
            return torch.randn(3)
        return data.draw(plain[shape])

    @settings(max_examples=200, deadline=None)
    @given(shapes, st.data())
    def check(shape, data):
        first, second = {"s": fill(shape, data)}, {"s": fill(shape, data)}
        reused = plan_shard(second, plan_shard(first))
        buffers = []
        for layout in (reused, plan_shard(second)):
            buffers.append(bytearray(layout.size))
            write_shard(buffers[-1], layout, 3)
        got, fresh = (read_shard(buffer)[0] for buffer in buffers)
        assert repr(got) == repr(fresh)

    check()
