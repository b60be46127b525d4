"""One shard brought from the nodes that hold it into a file a worker will read.

FetchContext is what a generation's restore pooled (who holds each shard of the
generation before, how to reach them); fetch_shard tries the holders in turn, this
node first (a hard link to its own copy, verified), then its peers through the
transport, into a spare slot where one fits, and checks each copy as the worker will
read it. Both the workers' requests (fetcher.py) and the prefetch (prefetch.py) use it.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ....core.snapshots.format import SnapshotError, check_shard
from ....core.snapshots.restore_plan import ShardId, Written
from ..checksums import verify
from ..peers.transport import Address, ShardTransport
from ..peers.wire import ShardError
from ..shard_store import ShardStore

logger = logging.getLogger(__name__)


@dataclass
class FetchContext:
    """What the generation's restore pooled: who holds what, and how to reach them."""

    generation: int
    node_rank: int
    local_ranks: list[int]
    holders: Mapping[ShardId, list[int]]  # a previous-generation shard -> node ranks
    servers: Mapping[int, Address]
    transport: ShardTransport
    # Where the save the workers were restored to was written (restore_plan.written_in):
    # a request for its step names that generation's shards, not the previous one's.
    loaded: Written | None = None
    world_size: int = 0  # the new world's: what prefetch() predicts a load from

    def written_in(self, step: int) -> int:
        if self.loaded is not None and self.loaded.step == step:
            return self.loaded.generation
        return self.generation - 1


def holders_of(inventory: Mapping[int, list[ShardId]]) -> dict[ShardId, list[int]]:
    found: dict[ShardId, list[int]] = {}
    for node, shards in inventory.items():
        for shard in shards:
            found.setdefault(shard, []).append(node)
    return found


def fetch_shard(
    store: ShardStore, context: FetchContext, shard: ShardId, target_path: str
) -> tuple[int | None, str | None]:
    """Put an intact copy of `shard` at target_path, checked as a worker will read it:
    (the node whose copy it is, None) or (None, why none could be had)."""
    holders = sorted(context.holders.get(shard, []), key=lambda n: n != context.node_rank)
    if not holders:
        return None, f"no node holds {shard}"
    problems = []
    for holder in holders:
        try:
            if holder == context.node_rank:
                _copy_local(store, shard, target_path)
            else:
                _copy_remote(store, context, holder, shard, target_path)
            _check(target_path)
            return holder, None
        except (OSError, ShardError, SnapshotError, KeyError) as exc:
            with contextlib.suppress(FileNotFoundError):
                os.remove(target_path)
            problems.append(f"node {holder}: {exc}")
            logger.warning("copy of %s on node %d is unusable (%s)", shard, holder, exc)
    return None, "; ".join(problems)


def _copy_local(store: ShardStore, shard: ShardId, target_path: str) -> None:
    """A hard link to the local copy, verified: no copy. Nothing writes a previous
    generation's slot or replica file again (the store frees it two generations on),
    and the worker maps it privately."""
    found = store.open_shard(shard)
    if found is None:
        raise ShardError("the local copy is gone")
    buffer, size, crcs = found
    if not verify(buffer, size, crcs):
        raise ShardError("the local copy failed its checksum")
    store.link_shard(shard, target_path)


def _check(path: str) -> None:
    """SnapshotError unless the file is a shard a worker can read (check_shard)."""
    with open(path, "rb") as handle:
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        check_shard(buffer)
    finally:
        buffer.close()


def _copy_remote(
    store: ShardStore, context: FetchContext, holder: int, shard: ShardId, target_path: str
) -> None:
    targets: list[Any] = []

    def into(size: int) -> Any:
        # A spare slot left by the restore (a rank restored from local memory takes
        # none) is received into at memory speed; fresh memory faults in page by page.
        targets.append(store.spare_or_fresh(target_path, size, f"{shard}, fetched"))
        return targets[-1]

    try:  # the copy is verified against its checksums
        context.transport.fetch_shard(context.servers[holder], shard, into)
    finally:
        for target in targets:
            # A transfer cut off mid-shard may leave a view of the mapping in its
            # traceback: the mapping goes when that does.
            with contextlib.suppress(BufferError):
                target.close()
