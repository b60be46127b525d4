"""Putting a restore plan's copies into the new workers' slots, on this node.

Each of this node's new ranks gets its planned shard: from local memory (a hard link to
the slot or replica that holds it, or a copy when several ranks restore it), else
fetched from a holder, checksum verified. Before a worker is given a copy, the copy is
checked as the worker will read it (core.snapshots.format.check_shard: its header fits
what holds it, its skeleton decodes and lies inside its data): a copy the worker could
not read is unusable, like one that failed its checksum, and the next holder is tried;
restorer.Restorer.agree plans again without it when no holder is left.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ....core.errors import RtrainError
from ....core.layout.topology import Topology
from ....core.snapshots.format import HEADER_SIZE, SnapshotError, check_shard, set_replicated
from ....core.snapshots.restore_plan import RestoreSource, ShardId, plan_restore
from ...observe.progress import WaitProgress
from ..checksums import verify
from ..disk.checkpoints import CheckpointDir, load_verified, newest_complete
from ..peers.transport import Peers
from ..peers.wire import ShardError
from ..shard_store import ShardStore

logger = logging.getLogger(__name__)

# Each attempt drops at least one bad copy; a shard has --snapshot-copies of them.
MAX_ATTEMPTS = 8


@dataclass
class RestoreResult:
    step: int | None
    local: int = 0
    fetched: int = 0
    from_dp_peer: int = 0
    from_disk: str = ""
    seconds: float = 0.0
    # The generation whose shards were restored, when they were carried over
    # generations that restored nothing (None: the previous generation's).
    read_from: int | None = None

    def describe(self) -> str:
        if self.step is None:
            return "no snapshot to restore: workers start fresh"
        if self.from_disk:
            return (
                f"restored step {self.step} from the disk checkpoint in {self.from_disk} "
                f"in {self.seconds:.2f}s: no step survives in memory for every rank"
            )
        peer = f", {self.from_dp_peer} from a DP peer's shard" if self.from_dp_peer else ""
        return (
            f"restored step {self.step}: {self.local} shards from local memory, "
            f"{self.fetched} from peers{peer}, in {self.seconds:.2f}s"
        )


def restore_once(
    store: ShardStore,
    peers: Peers,
    topology: Topology,
    node_rank: int,
    inventory: dict[int, list[ShardId]],
) -> RestoreResult:
    """The plan for these inventories, alone (no agreement: tools, tests), made again
    without the copies found unusable until one works."""
    unusable: set[tuple[ShardId, int]] = set()
    for _ in range(MAX_ATTEMPTS):
        plan = plan_restore(topology, inventory, unusable=unusable)
        if plan is None:
            return RestoreResult(None)
        result, bad, complete = restore_planned(store, peers, topology, node_rank, plan)
        if complete:
            return result
        unusable |= bad
    raise RtrainError(f"no restore plan worked in {MAX_ATTEMPTS} attempts")


def restore_planned(
    store: ShardStore,
    peers: Peers,
    topology: Topology,
    node_rank: int,
    plan: tuple[int, dict[int, RestoreSource]],
) -> tuple[RestoreResult, set[tuple[ShardId, int]], bool]:
    """Try the plan for this node's ranks: the result, the bad copies, complete or not."""
    step, sources = plan
    result = RestoreResult(step)
    bad: set[tuple[ShardId, int]] = set()
    mine = [c for c in topology.coords if c.node_rank == node_rank]
    uses = Counter(sources[c.rank].shard for c in mine)
    complete = True
    with WaitProgress(f"restoring step {step}", log=logger) as progress:
        for done, coord in enumerate(mine):
            progress.update(f"{done} of {len(mine)} shards in place", done, len(mine))
            source = sources[coord.rank]
            exclusive = uses[source.shard] == 1
            used = _restore_one(
                store, peers, topology.generation, coord.rank, source, node_rank, exclusive, bad
            )
            if used is None:
                logger.error(
                    "no intact copy of %s for rank %d (every holder unreachable or corrupt)",
                    source.shard,
                    coord.rank,
                )
                complete = False
                continue
            result.local += used == node_rank
            result.fetched += used != node_rank
            result.from_dp_peer += source.from_dp_peer
        progress.update(f"{len(mine)} of {len(mine)} shards in place", len(mine), len(mine))
    return result, bad, complete


def _restore_one(
    store: ShardStore,
    peers: Peers,
    generation: int,
    rank: int,
    source: RestoreSource,
    node_rank: int,
    exclusive: bool,
    bad: set[tuple[ShardId, int]],
) -> int | None:
    """Put `source` into the new worker's slot; the node whose copy was used, or None.
    Copies found bad are added to `bad`."""
    holders = sorted(source.holders, key=lambda n: n != node_rank)  # local copy first
    for holder in holders:
        try:
            if holder == node_rank:
                found = store.open_shard(source.shard)
                if found is None:
                    raise ShardError("the local copy is gone")
                buffer, size, crcs = found
                if not verify(buffer, size, crcs):
                    raise ShardError("the local copy failed its checksum")
                check_shard(buffer, size)  # as the worker will read it
                if exclusive:  # the common case: no copy at all
                    target = store.adopt(source.shard, generation, rank)
                else:
                    target = store.restore_target(generation, rank, size)
                    memoryview(target)[:size] = memoryview(buffer)[:size]
            else:
                target = _fetch(peers, holder, store, source.shard, generation, rank)
                try:
                    check_shard(target)
                except SnapshotError:
                    target[:HEADER_SIZE] = bytes(HEADER_SIZE)  # no worker may read it
                    target.close()
                    raise
            # Under its new name the shard is not replicated yet: the replicator copies it.
            set_replicated(target, -1)
            target.close()
            return holder
        except (OSError, ShardError, SnapshotError, KeyError) as exc:
            bad.add((source.shard, holder))
            logger.warning(
                "copy of %s on node %d is unusable (%s); trying the next", source.shard, holder, exc
            )
    return None


def _fetch(
    peers: Peers, holder: int, store: ShardStore, shard: ShardId, generation: int, rank: int
) -> Any:
    """Fetch `shard` from node `holder` straight into the new worker's slot."""
    targets: list[Any] = []

    def into(size: int) -> Any:
        targets.append(store.restore_target(generation, rank, size))
        return targets[-1]

    peers.transport.fetch_shard(peers.servers[holder], shard, into)
    return targets[-1]


def restore_from_disk(
    store: ShardStore, directory: CheckpointDir, topology: Topology, node_rank: int
) -> RestoreResult:
    """Every local rank from the newest complete disk checkpoint (the same on all nodes)."""
    found = newest_complete(directory)
    if found is None:
        logger.info("no complete checkpoint in %s: workers start fresh", directory.path)
        return RestoreResult(None)
    step, world = found
    for coord in topology.coords:
        if coord.node_rank != node_rank:
            continue
        # A larger world than the checkpoint's takes ranks modulo: DP replicas.
        try:
            data = load_verified(directory, step, coord.rank % world)
        except (OSError, ValueError, KeyError) as exc:
            raise RtrainError(
                f"cannot restore rank {coord.rank} from {directory.path}: {exc}"
            ) from None
        target = store.restore_target(topology.generation, coord.rank, len(data))
        target[: len(data)] = data
        set_replicated(target, -1)
        target.close()
    return RestoreResult(step, from_disk=directory.path)
