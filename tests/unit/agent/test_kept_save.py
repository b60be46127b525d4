"""The shards a resharding load read outlive the generations that relabel them (issue
35 item 6), against the real shard store and shard server on real files: pruning
keeps the save's shards, and a worker's request for that step names them."""

from __future__ import annotations

from pathlib import Path

import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.restore.shard_fetch import FetchContext
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.format import plan_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId, Written
from rtrain.core.worker.snapshots import slot_paths

SECRET = b"0123456789abcdef0123456789abcdef"


def shard_bytes(rank: int, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((1000,), float(rank * 100 + step)), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


def test_pruning_keeps_the_shards_of_the_save_a_load_read(tmp_path):
    store = ShardStore(str(tmp_path), budget=0)
    server = ShardServer("127.0.0.1", SECRET, store)
    try:
        # generation 0: rank 0's slots hold steps 7 and 8; replicas of rank 2, steps 7, 8
        for path, step in zip(slot_paths(store.snap_dir(0), 0), (7, 8), strict=False):
            Path(path).write_bytes(shard_bytes(0, step))
        client = ShardClient("127.0.0.1", server.port, SECRET)
        try:
            for step in (7, 8):
                data = shard_bytes(2, step)
                client.put(ShardId(0, 2, step), data, len(data), checksums(data, len(data)))
        finally:
            client.close()
        Path(slot_paths(store.snap_dir(1), 0)[0]).write_bytes(shard_bytes(0, 8))  # relabelled
        # generation 2 starts: generation 0's save of step 8 was loaded and not followed
        # by a save every rank has, so its shards stay; the rest of generation 0 goes
        store.prune(keep_from=1, keep=Written(0, 8))
        assert set(store.inventory()) == {ShardId(0, 0, 8), ShardId(0, 2, 8), ShardId(1, 0, 8)}
        assert store.open_shard(ShardId(0, 2, 8)) is not None
        # once a restore finds a newer step, nothing is kept
        store.prune(keep_from=2)
        assert store.inventory() == []
    finally:
        server.close()


def test_a_request_for_the_loaded_step_names_the_generation_it_was_written_in():
    context = FetchContext(2, 0, [0], {}, {}, TcpTransport(SECRET), Written(0, 8))
    assert context.written_in(8) == 0
    assert context.written_in(9) == 1  # any other step: the previous generation's
    assert FetchContext(2, 0, [0], {}, {}, TcpTransport(SECRET)).written_in(8) == 1
