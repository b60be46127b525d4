"""A shard fetched from a peer for a resharding load (agent/snapshots/restore/shard_fetch.py)
lands in a spare slot when the pool has one, and a replica is served from the mapping
kept since its receipt: the real shard store, server and client on real files."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.restore.shard_fetch import FetchContext, fetch_shard
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.format import plan_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId

SECRET = b"0123456789abcdef0123456789abcdef"
SHARD = ShardId(0, 2, 8)


def shard_bytes() -> bytearray:
    # more than one checksum chunk (8 MiB), so the streaming digest crosses chunks
    layout = plan_shard({"w": torch.arange(5 << 20, dtype=torch.float32), "step": 8})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 8)
    return buffer


def test_a_fetched_shard_lands_in_a_spare_and_matches_the_peers_copy(tmp_path: Path) -> None:
    peer = ShardStore(str(tmp_path / "peer"), budget=0)
    node = ShardStore(str(tmp_path / "node"), budget=0)
    server = ShardServer("127.0.0.1", SECRET, peer)
    data = shard_bytes()
    try:
        client = ShardClient("127.0.0.1", server.port, SECRET)
        try:
            client.put(SHARD, data, len(data), checksums(data, len(data)))
        finally:
            client.close()
        assert peer.open_shard(SHARD) is not None
        node.pool.top_up(1, len(data), 2 * len(data))
        context = FetchContext(
            1, 0, [0], {SHARD: [1]}, {1: ("127.0.0.1", server.port)}, TcpTransport(SECRET)
        )
        target = os.path.join(node.snap_dir(1), "fetched-r2-s8-ab.shard")
        assert fetch_shard(node, context, SHARD, target) == (1, None)
        assert node.pool.count() == 0  # the spare was taken
        assert Path(target).read_bytes()[: len(data)] == bytes(data)
        # no spare left: fresh memory, the same bytes
        again = os.path.join(node.snap_dir(1), "fetched-r2-s8-cd.shard")
        assert fetch_shard(node, context, SHARD, again) == (1, None)
        assert Path(again).read_bytes() == bytes(data)
    finally:
        server.close()
        node.pool.close()
