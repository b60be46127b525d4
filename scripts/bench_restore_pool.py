"""Restore from a peer: into fresh shared memory, and into a spare slot written before.

For each state size, one shard (a state dict of float32 tensors) sits in a peer's
ShardServer; a node restores it as the agent does (ShardClient.get into the new
worker's slot 0, checksums verified, then the worker's restore(copy=False) maps it):

  fresh   the slot is a new file: every page faults in as the stream arrives
  spare   the slot is a spare from the store's pool (agent/snapshots/spare_pool.py),
          written once before the failure, as the service keeps one per local rank

each against one loopback TCP stream of the same bytes in this process (the limit; the
target is >= 0.7 of it). Each figure is the best of --reps; the spares are made again
before each repetition, outside the time.

    python scripts/bench_restore_pool.py --sizes 100,1000
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time
from collections.abc import Callable

import torch
from bench_snapshot import loopback_seconds  # the same yardstick as bench_snapshot's peer column
from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.format import plan_shard, read_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId

SECRET = os.urandom(32)
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


def state_of(mb: int) -> dict[str, torch.Tensor]:
    quarter = mb * 2**20 // 16
    return {f"layer{i}": torch.randn(quarter) for i in range(4)}


def best(run: Callable[[], None], reps: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(reps):
        before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def restore_seconds(mb: int, reps: int) -> dict[str, float]:
    layout = plan_shard(state_of(mb))
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 1)
    size, shard = layout.size, ShardId(0, 0, 1)
    with tempfile.TemporaryDirectory(dir=SHM) as folder:
        peer = ShardServer("127.0.0.1", SECRET, ShardStore(os.path.join(folder, "peer"), 0))
        node = ShardStore(os.path.join(folder, "node"), 0)
        client = ShardClient("127.0.0.1", peer.port, SECRET)
        try:
            client.put(shard, buffer, size, checksums(buffer, size))
            del buffer

            def restore() -> None:
                target = node.restore_target(1, 0, size)
                client.get(shard, lambda _: target)
                target.close()
                with open(os.path.join(node.snap_dir(1), "rank0.slot0"), "rb") as handle:
                    mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
                read_shard(mapped, copy=False)

            fresh = best(restore, reps)
            spare = best(restore, reps, before=lambda: node.pool.top_up(1, size, 2 * size))
        finally:
            client.close()
            peer.close()
            node.pool.close()
    return {"bytes": size, "fresh": fresh, "spare": spare}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000", help="state sizes in MB")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    print(
        "| state | loopback stream | restore, fresh memory | vs loopback "
        "| restore, spare slot | vs loopback (target >= 0.7) |"
    )
    print("|---|---|---|---|---|---|")
    for mb in (int(s) for s in args.sizes.split(",")):
        row = restore_seconds(mb, args.reps)
        limit = loopback_seconds(row["bytes"], args.reps)
        gbs = {k: row["bytes"] / row[k] / 2**30 for k in ("fresh", "spare")}
        print(
            f"| {mb} MB | {row['bytes'] / limit / 2**30:.2f} GB/s "
            f"| {gbs['fresh']:.2f} GB/s | {limit / row['fresh']:.2f} "
            f"| {gbs['spare']:.2f} GB/s | {limit / row['spare']:.2f} |"
        )


if __name__ == "__main__":
    main()
