"""Slot headers that do not fit their files (issue 32, item 3), against the real shard
store, replicator, shard server and restore on real files.

Keep a slot's magic, version and committed flag but write step + 1 and a data length
of 2**36: before, the replicator sent a 64 GiB "replica" (refused by the receiver's
budget, the worker waited on it until killed), the restore chose that step (its
checksums were computed over the same garbage, and cached) and every worker died with
'shard is truncated'. With 2**50 the agent built a chunk list of many GB.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from rtrain.agent.snapshots.replicator import Replicator
from rtrain.agent.snapshots.restorer import restore_once
from rtrain.agent.snapshots.shard_client import Peers
from rtrain.agent.snapshots.shard_server import ShardServer
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.snapshots.format import (
    HEADER,
    plan_shard,
    read_shard,
    set_replicated,
    write_shard,
)
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.worker.snapshots import slot_paths

SECRET = b"0123456789abcdef0123456789abcdef"


def shard_bytes(rank: int, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((3000,), float(rank * 1000 + step)), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


def write_slots(store: ShardStore, steps: dict[int, list[int]], generation: int = 0) -> None:
    """rank -> its slots' steps, written as a worker writes them."""
    for rank, ranks_steps in steps.items():
        slots = slot_paths(store.snap_dir(generation), rank)
        for path, step in zip(slots, ranks_steps, strict=False):
            Path(path).write_bytes(shard_bytes(rank, step))


def rewrite_header(path: str, step: int | None = None, data_len: int | None = None) -> None:
    """Keep magic, version, state and meta length; write another step or data length."""
    with open(path, "r+b") as handle:
        magic, version, state, old_step, meta_len, old_len, replicated = HEADER.unpack(
            handle.read(HEADER.size)
        )
        new_step = old_step if step is None else step
        new_len = old_len if data_len is None else data_len
        handle.seek(0)
        handle.write(HEADER.pack(magic, version, state, new_step, meta_len, new_len, replicated))


def one_node_restart(ranks: int = 2):
    """Generation 1 of a node of `ranks` workers that ran generation 0 alone."""
    before = build_grid(Layout(), 0, [NodeSlot("n", ranks)])
    return recompute_topology(Layout(), 1, [NodeSlot("n", ranks)], before)


def restored(store: ShardStore, rank: int, generation: int = 1) -> tuple[float, int]:
    """(the restored tensor's value, its step) of a new worker's slot 0."""
    data = bytearray(Path(slot_paths(store.snap_dir(generation), rank)[0]).read_bytes())
    state, step = read_shard(data)
    assert state["step"] == step
    return float(state["w"][0]), step


@pytest.mark.parametrize("data_len", [2**36, 2**50])
def test_a_header_longer_than_its_slot_is_neither_listed_nor_opened(tmp_path, data_len):
    store = ShardStore(str(tmp_path), budget=0)
    write_slots(store, {0: [4, 5]})
    newest = slot_paths(store.snap_dir(0), 0)[1]
    rewrite_header(newest, step=6, data_len=data_len)
    assert [s for s, _ in store.local_slots()] == [ShardId(0, 0, 4)]
    assert store.open_shard(ShardId(0, 0, 6)) is None
    assert store.inventory() == [ShardId(0, 0, 4)]


def test_restore_takes_the_newest_step_whose_headers_fit(tmp_path):
    # rank 1 is a step ahead; rank 0's newest slot (step 5) now claims step 6, which
    # every rank would then "have": before, the plan chose 6 and the worker died.
    store = ShardStore(str(tmp_path), budget=0)
    write_slots(store, {0: [3, 4, 5], 1: [4, 5, 6]})
    rewrite_header(slot_paths(store.snap_dir(0), 0)[2], step=6, data_len=2**36)
    result = restore_once(
        store, Peers(SECRET, None, {}), one_node_restart(), 0, {0: store.inventory()}
    )
    assert result.step == 4
    assert restored(store, 0) == (4.0, 4) and restored(store, 1) == (1004.0, 4)


def test_a_copy_whose_skeleton_does_not_fit_is_unusable_and_the_plan_is_made_again(tmp_path):
    # A header that fits its file but whose meta length cuts the skeleton: the agent
    # finds it before a worker does, marks that copy unusable and plans again.
    store = ShardStore(str(tmp_path), budget=0)
    write_slots(store, {0: [4, 5], 1: [4, 5]})
    path = slot_paths(store.snap_dir(0), 1)[1]
    with open(path, "r+b") as handle:
        fields = list(HEADER.unpack(handle.read(HEADER.size)))
        fields[4] -= 3  # meta_len: the skeleton's JSON loses its end
        handle.seek(0)
        handle.write(HEADER.pack(*fields))
    result = restore_once(
        store, Peers(SECRET, None, {}), one_node_restart(), 0, {0: store.inventory()}
    )
    assert result.step == 4
    assert restored(store, 0) == (4.0, 4) and restored(store, 1) == (1004.0, 4)


def test_the_replicator_sends_no_size_a_header_does_not_fit_and_lives_on(tmp_path):
    sender = ShardStore(str(tmp_path / "a"), budget=0)
    receiver = ShardStore(str(tmp_path / "b"), budget=2**24)
    server = ShardServer("127.0.0.1", SECRET, receiver)
    write_slots(sender, {0: [4, 5]})
    slots = slot_paths(sender.snap_dir(0), 0)
    data = shard_bytes(0, 4)
    set_replicated(data, 4)
    Path(slots[0]).write_bytes(data)
    rewrite_header(slots[1], step=6, data_len=2**36)
    passes = threading.Semaphore(0)
    replicator = Replicator(sender, SECRET, on_pass=passes.release)
    try:
        replicator.follow(0, [("127.0.0.1", server.port)], world_size=1, local_ranks=1)
        for _ in range(20):  # passes with every slot file found
            assert passes.acquire(timeout=10)
        # A genuine step after it goes through: the thread lives on.
        Path(slots[2]).write_bytes(shard_bytes(0, 7))
        for _ in range(20):
            assert passes.acquire(timeout=10)
            if receiver.replica_steps(0, 0):
                break
    finally:
        replicator.close()
        server.close()
    assert receiver.replica_steps(0, 0) == [7]
    assert not server.refusals, server.refusals
    assert replicator.newest_replicated == 7


def test_a_worker_skips_a_slot_whose_header_does_not_fit(tmp_path, monkeypatch):
    """The worker's side: restore() reads the newest slot that fits, and the next
    snapshot neither waits for the misfit's replication nor keeps it."""
    import rtrain.core.worker.snapshots as api

    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(api, "_slots", None)
    monkeypatch.setattr(api, "WAIT_LIMIT_S", 1.0)
    paths = slot_paths(str(tmp_path), 0)
    for path, step in zip(paths, (1, 2), strict=False):
        data = shard_bytes(0, step)
        set_replicated(data, step)
        Path(path).write_bytes(data)
    rewrite_header(paths[1], step=3, data_len=2**36)
    got = api.restore()
    assert got is not None and got[1] == 1
    # The misfit is no snapshot: the next one neither waits for it nor keeps it.
    assert api.snapshot({"w": torch.ones(2), "step": 3}, 3)
    state, step = read_shard(bytearray(Path(paths[1]).read_bytes()))
    assert step == 3 and state["step"] == 3 and torch.equal(state["w"], torch.ones(2))


def test_a_worker_that_cannot_read_its_copy_marks_it_unusable(tmp_path, monkeypatch):
    import rtrain.core.worker.snapshots as api

    store = ShardStore(str(tmp_path), budget=0)
    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", store.snap_dir(0))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(api, "_slots", None)
    write_slots(store, {0: [4]})
    path = slot_paths(store.snap_dir(0), 0)[0]
    with open(path, "r+b") as handle:  # the skeleton's JSON loses its end
        fields = list(HEADER.unpack(handle.read(HEADER.size)))
        fields[4] -= 3
        handle.seek(0)
        handle.write(HEADER.pack(*fields))
    assert store.inventory() == [ShardId(0, 0, 4)]
    with pytest.raises(api.SnapshotError, match="skeleton refused"):
        api.restore()
    assert store.inventory() == []  # no plan counts it again
