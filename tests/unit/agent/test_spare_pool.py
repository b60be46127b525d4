"""Restores from a peer receive into spare slots written before the failure (issue 35
item 4), against the real shard store, shard server, client and restore on real files:
a restore takes a spare (its pages already there) instead of fresh memory, and a pool
emptied by failures in a row falls back to fresh memory with a log line."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import Peers, TcpTransport
from rtrain.agent.snapshots.restore.copies import restore_once
from rtrain.agent.snapshots.restore.restorer import RestoreRound
from rtrain.agent.snapshots.service import SnapshotService
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.agent.waiting import SYSTEM_CLOCK
from rtrain.core.config.component_specs import SnapshotPart
from rtrain.core.config.launch_spec import SnapshotSpec
from rtrain.core.contract.environment import SNAPSHOT_DIR
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.rendezvous.protocol import MemberInfo, Membership
from rtrain.core.snapshots.format import HEADER_SIZE, plan_shard, read_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.worker.snapshots import slot_paths

from .fakes import launch_spec, memory_store

SECRET = b"0123456789abcdef0123456789abcdef"
STEPS = {0: 4, 1: 5}  # the peer's replica of rank 0 in each generation


def shard_bytes(value: float, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((50_000,), value), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


@pytest.fixture
def peer(tmp_path):
    """A peer's shard server holding replicas of rank 0 (generations 0 and 1)."""
    server = ShardServer("127.0.0.1", SECRET, ShardStore(str(tmp_path / "peer"), budget=0))
    client = ShardClient("127.0.0.1", server.port, SECRET)
    try:
        for generation, step in STEPS.items():
            data = shard_bytes(float(step), step)
            shard = ShardId(generation, 0, step)
            client.put(shard, data, len(data), checksums(data, len(data)))
    finally:
        client.close()
    yield server, len(shard_bytes(0.0, 0))
    server.close()


def restore_from(server: ShardServer, store: ShardStore, generation: int) -> int | None:
    """A replacement node (node 1) restores rank 0 of `generation` from the peer (node 0)."""
    before = build_grid(Layout(), generation - 1, [NodeSlot("old", 1)])
    topology = recompute_topology(Layout(), generation, [NodeSlot("new", 1)], before)
    topology = replace(topology, coords=tuple(replace(c, node_rank=1) for c in topology.coords))
    inventory = {0: [ShardId(generation - 1, 0, STEPS[generation - 1])], 1: []}
    peers = Peers(TcpTransport(SECRET), {0: ("127.0.0.1", server.port)})
    result = restore_once(store, peers, topology, 1, inventory)
    assert result.fetched == 1
    return result.step


def slot0(store: ShardStore, generation: int) -> str:
    return slot_paths(store.snap_dir(generation), 0)[0]


def test_a_restore_from_a_peer_lands_in_a_spare_written_before(tmp_path, peer, caplog):
    server, size = peer
    store = ShardStore(str(tmp_path / "node"), budget=2**24)
    assert store.pool.top_up(count=1, size=size, room=2**24) == 1
    (spare,) = Path(store.pool.folder).iterdir()
    inode = spare.stat().st_ino
    with caplog.at_level(logging.WARNING):
        assert restore_from(server, store, 1) == STEPS[0]
    # the worker's slot 0 is the spare's file, holding the peer's shard bitwise
    assert os.stat(slot0(store, 1)).st_ino == inode
    state, step = read_shard(bytearray(Path(slot0(store, 1)).read_bytes()))
    assert step == 4 and torch.equal(state["w"], torch.full((50_000,), 4.0))
    assert store.pool.count() == 0 and "fresh memory" not in caplog.text


def test_an_exhausted_pool_falls_back_to_fresh_memory_with_a_log_line(tmp_path, peer, caplog):
    server, size = peer
    store = ShardStore(str(tmp_path / "node"), budget=2**24)
    store.pool.top_up(count=1, size=size, room=2**24)
    assert restore_from(server, store, 1) == STEPS[0]  # takes the only spare
    with caplog.at_level(logging.WARNING):
        assert restore_from(server, store, 2) == STEPS[1]  # a second failure, no refill
    assert "no spare slot left for rank 0" in caplog.text
    state, step = read_shard(bytearray(Path(slot0(store, 2)).read_bytes()))
    assert step == 5 and torch.equal(state["w"], torch.full((50_000,), 5.0))


def test_the_pool_holds_what_the_budget_leaves_and_gives_way_to_replicas(tmp_path):
    size = 2**20
    store = ShardStore(str(tmp_path / "node"), budget=5 * size)
    assert store.pool.top_up(count=8, size=size, room=3 * size) == 3  # the room, not 8
    assert store.used_bytes() == 3 * size  # the spares count toward the budget
    # a replica that needs room the spares hold gets it: spares go first
    with store.receive(ShardId(0, 1, 1), 4 * size) as (_, buffer):
        assert len(buffer) == 4 * size
    assert store.pool.count() < 3 and store.used_bytes() <= 5 * size
    # larger shards than the spares: the small ones are let go, larger ones made
    assert store.pool.top_up(count=1, size=2 * size, room=2 * size) == 1
    assert store.pool.count() == store.pool.count(2 * size)


def test_a_spare_taken_is_wiped_and_never_read_as_a_snapshot(tmp_path):
    store = ShardStore(str(tmp_path / "node"), budget=0)
    store.pool.top_up(count=1, size=2**16, room=2**16)
    target = store.restore_target(1, 0, 1000)
    assert bytes(target[:HEADER_SIZE]) == bytes(HEADER_SIZE) and len(target) >= 1000
    target.close()
    assert store.local_slots() == []


def test_the_service_fills_the_pool_after_a_generations_first_commit(tmp_path):
    # One node of one worker: once the worker commits, the service makes one spare as
    # large as its shard, off the step's path (a thread of its own), within the budget.
    spec = launch_spec("--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    part = SnapshotPart(SnapshotSpec(memory=2**24, copies=1), spec.rdzv.run_id)
    service = SnapshotService(str(tmp_path), "127.0.0.1", part, secret=b"s")
    try:
        rdzv = JobRendezvous.over(memory_store(), spec)
        membership = Membership(0, (MemberInfo("a", "127.0.0.1", 1),))
        topology = build_grid(Layout(), 0, [NodeSlot("a", 1)])
        service.start(rdzv)
        env = service.prepare(RestoreRound(membership, topology, 0, 5.0), 1)
        assert service.store.pool.count() == 0  # nothing committed: no size to go by
        data = shard_bytes(1.0, 3)
        Path(slot_paths(env[SNAPSHOT_DIR], 0)[0]).write_bytes(data)
        assert SYSTEM_CLOCK.wait_until(lambda: service.store.pool.count(len(data)) == 1, 30, 0.01)
        assert service.store.used_bytes() <= 2**24
    finally:
        service.close()
    assert not os.listdir(service.store.pool.folder)  # closed: the spares are gone
