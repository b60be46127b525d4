"""Slot headers that do not fit their files (issue 32, item 3), against the real shard
store, replicator, shard server and restore on real files.

Keep a slot's magic, version and committed flag but write step + 1 and a data length
of 2**36: before, the replicator sent a 64 GiB "replica" (refused by the receiver's
budget, the worker waited on it until killed), the restore chose that step (its
checksums were computed over the same garbage, and cached) and every worker died with
'shard is truncated'. With 2**50 the agent built a chunk list of many GB.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import BinaryIO

import pytest
import torch

from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import Peers, TcpTransport
from rtrain.agent.snapshots.replication.replicator import Replicator
from rtrain.agent.snapshots.restore.copies import restore_once
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.snapshots.format import (
    HEADER,
    HEADER_SIZE,
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


def _json_end(handle: BinaryIO, fields: list) -> int:
    """The length of the skeleton's JSON in a slot whose header is `fields`: the meta
    length less the spaces of the skeleton's room (core/snapshots/format.py)."""
    handle.seek(HEADER_SIZE)
    return len(handle.read(fields[4]).rstrip(b" "))


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
        store, Peers(TcpTransport(SECRET), {}), one_node_restart(), 0, {0: store.inventory()}
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
        fields[4] = _json_end(handle, fields) - 3  # meta_len: the skeleton's JSON loses its end
        handle.seek(0)
        handle.write(HEADER.pack(*fields))
    result = restore_once(
        store, Peers(TcpTransport(SECRET), {}), one_node_restart(), 0, {0: store.inventory()}
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
    listener = SimpleNamespace(committed=lambda rank, step: None, between_passes=passes.release)
    replicator = Replicator(sender, TcpTransport(SECRET), listener)
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
        fields[4] = _json_end(handle, fields) - 3
        handle.seek(0)
        handle.write(HEADER.pack(*fields))
    assert store.inventory() == [ShardId(0, 0, 4)]
    with pytest.raises(api.SnapshotError, match="skeleton refused"):
        api.restore()
    assert store.inventory() == []  # no plan counts it again


def test_a_replica_whose_header_does_not_fit_it_is_refused_not_kept(tmp_path):
    # A sender that trusted such a header (a confused peer): the bytes it sent are
    # whole and match its digests, but the header claims more than they are.
    from rtrain.agent.snapshots.checksums import checksums
    from rtrain.agent.snapshots.peers.client import ShardClient
    from rtrain.agent.snapshots.peers.wire import ShardError

    receiver = ShardStore(str(tmp_path), budget=0)
    server = ShardServer("127.0.0.1", SECRET, receiver)
    data = shard_bytes(0, 5)
    fields = list(HEADER.unpack_from(data))
    fields[3], fields[5] = 6, 2**36  # step, data length
    HEADER.pack_into(data, 0, *fields)
    client = ShardClient("127.0.0.1", server.port, SECRET)
    try:
        with pytest.raises(ShardError, match="refused the replica"):
            client.put(ShardId(0, 0, 6), data, len(data), checksums(data, len(data)))
    finally:
        client.close()
        server.close()
    assert receiver.replicas() == [] and server.refusals["corrupt"] == 1


SLOT_STEPS = {0: [3, 4, 5], 1: [4, 5, 6]}  # rank -> its three slots' steps (rank 1 ahead)


def _misfit(fields: list[int], length: int, step: int, meta_len: int, excess: int) -> bytes:
    """Magic, version and committed flag kept; a step and lengths that overrun the file."""
    data_len = max(0, length - HEADER.size - meta_len) + excess
    return HEADER.pack(*fields[:3], step, meta_len, data_len, fields[6])


def _garbage():
    from hypothesis import strategies as st

    random = st.binary(min_size=HEADER.size, max_size=HEADER.size).map(lambda b: ("random", b))
    misfit = st.tuples(
        st.just("misfit"),
        st.one_of(st.just(None), st.integers(-(2**63), 2**63 - 1)),  # None: step + 1
        st.one_of(st.just(None), st.integers(0, 2**62)),  # None: the real meta length
        st.sampled_from([1, 2**36, 2**50, 2**62]) | st.integers(1, 2**62),
    )
    cut = st.tuples(st.just("cut"), st.integers(1, 40))  # the skeleton loses its end
    return random | misfit | cut


def _write_garbage(path: str, garbage: tuple) -> None:
    with open(path, "r+b") as handle:
        length = os.fstat(handle.fileno()).st_size
        fields = list(HEADER.unpack(handle.read(HEADER.size)))
        if garbage[0] == "random":
            head = garbage[1]
        elif garbage[0] == "misfit":
            _, step, meta_len, excess = garbage
            step = fields[3] + 1 if step is None else step
            meta_len = fields[4] if meta_len is None else meta_len
            head = _misfit(fields, length, step, meta_len, excess)
        else:
            fields[4] = _json_end(handle, fields) - garbage[1]
            head = HEADER.pack(*fields)
        handle.seek(0)
        handle.write(head)


@pytest.mark.slow
def test_restore_picks_the_newest_intact_step_whatever_is_written_over_headers(tmp_path):
    """Random bytes, or a kept magic with a step and lengths that overrun the slot, or a
    skeleton cut short, over any of the slots' headers: the restore takes the newest
    step at which every rank has an intact slot, each rank its own state, bitwise."""
    import shutil

    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st

    slots = [(rank, i) for rank, steps in SLOT_STEPS.items() for i in range(len(steps))]
    hits = st.dictionaries(st.sampled_from(slots), _garbage(), min_size=1, max_size=len(slots))
    examples = iter(range(10**6))

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hits)
    def check(hits: dict[tuple[int, int], tuple]) -> None:
        assume(not any(g[0] == "random" and g[1].startswith(b"RTRSHRD1") for g in hits.values()))
        root = tmp_path / str(next(examples))
        store = ShardStore(str(root), budget=0)
        write_slots(store, SLOT_STEPS)
        for (rank, index), garbage in hits.items():
            _write_garbage(slot_paths(store.snap_dir(0), rank)[index], garbage)
        intact = {
            rank: {s for i, s in enumerate(steps) if (rank, i) not in hits}
            for rank, steps in SLOT_STEPS.items()
        }
        common = set.intersection(*intact.values())
        topology = one_node_restart()
        result = restore_once(
            store, Peers(TcpTransport(SECRET), {}), topology, 0, {0: store.inventory()}
        )
        if common:
            step = max(common)
            assert result.step == step, (hits, result)
            assert restored(store, 0) == (step, step)
            assert restored(store, 1) == (1000 + step, step)
        elif any(intact.values()):  # no step both have: a DP peer's shard stands in
            step = max(set.union(*intact.values()))
            assert result.step == step and result.from_dp_peer, (hits, result)
            holders = {1000.0 * r + step for r, steps in intact.items() if step in steps}
            assert {restored(store, 0)[0], restored(store, 1)[0]} <= holders
        else:
            assert result.step is None, (hits, result)
        shutil.rmtree(root)

    check()
