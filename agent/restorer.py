"""Before a generation's workers start: agree on the step to restore and fetch the shards.

Every agent publishes what it holds (its workers' slots, the replicas it keeps) and
where its ShardServer listens; once all members have, each computes the same plan
(core.restore_plan) and puts each of its new workers' shards into that worker's slot,
from local memory or from a peer, checksum verified. A corrupt or unreachable copy is
reported and the next holder is tried. Then rtrain.core.restore() in the worker reads
its slot.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rtrain.agent.disk_checkpoints import load_verified, newest_complete
from rtrain.agent.rendezvous import StoreRendezvous
from rtrain.agent.shard_server import ShardClient, ShardError
from rtrain.agent.shard_store import ShardStore
from rtrain.core.errors import RtrainError
from rtrain.core.restore_plan import RestoreSource, ShardId, plan_restore
from rtrain.core.snapshot_format import set_replicated, verify
from rtrain.core.store_protocol import (
    Membership,
    ProtocolError,
    StoreKeys,
    decode_master,
    encode_master,
)
from rtrain.core.topology import Topology

logger = logging.getLogger(__name__)

POLL_S = 0.01


@dataclass
class RestoreResult:
    step: int | None
    local: int = 0
    fetched: int = 0
    from_dp_peer: int = 0
    from_disk: str = ""
    seconds: float = 0.0

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


def publish(
    rdzv: StoreRendezvous,
    keys: StoreKeys,
    store: ShardStore,
    generation: int,
    node_rank: int,
    host: str,
    port: int,
) -> None:
    shards = [[s.generation, s.rank, s.step] for s in store.inventory()]
    rdzv.call("set", keys.shards(generation, node_rank), encode_master(host, port))
    rdzv.call("set", keys.inventory(generation, node_rank), json.dumps(shards))


def gather(
    rdzv: StoreRendezvous,
    keys: StoreKeys,
    membership: Membership,
    timeout: float,
    watch: Callable[[], object] | None = None,
) -> tuple[dict[int, list[ShardId]], dict[int, tuple[str, int]]]:
    """Every member's inventory and shard server address (waits until all are in)."""
    generation = membership.generation
    inventory: dict[int, list[ShardId]] = {}
    servers: dict[int, tuple[str, int]] = {}
    end = time.monotonic() + timeout
    for node in range(len(membership.members)):
        key = keys.inventory(generation, node)
        while not rdzv.call("check", [key]):
            rdzv.raise_if_ended(generation, watch)
            if time.monotonic() > end:
                raise RtrainError(
                    f"node {node} did not publish its shards for generation {generation}", 75
                )
            time.sleep(POLL_S)
        try:
            raw = json.loads(rdzv.call("get", key))
            inventory[node] = [ShardId(int(g), int(r), int(s)) for g, r, s in raw]
            servers[node] = decode_master(rdzv.call("get", keys.shards(generation, node)))
        except (ValueError, TypeError, ProtocolError) as exc:
            logger.error("refusing node %d's shard inventory: %s", node, exc)
            inventory[node] = []
    return inventory, servers


def restore_local_ranks(
    store: ShardStore,
    secret: bytes,
    topology: Topology,
    node_rank: int,
    inventory: dict[int, list[ShardId]],
    servers: dict[int, tuple[str, int]],
    checkpoint_dir: str | None = None,
) -> RestoreResult:
    started = time.monotonic()
    plan = plan_restore(topology, inventory)
    if plan is None:
        # Every agent sees the same inventory, so every agent comes here together.
        if checkpoint_dir:
            result = restore_from_disk(store, checkpoint_dir, topology, node_rank)
            result.seconds = time.monotonic() - started
            return result
        if any(inventory.values()):
            logger.warning("no step that every rank can restore survives: workers start fresh")
        return RestoreResult(None)
    step, sources = plan
    result = RestoreResult(step)
    uses = Counter(sources[c.rank].shard for c in topology.coords if c.node_rank == node_rank)
    for coord in topology.coords:
        if coord.node_rank != node_rank:
            continue
        source = sources[coord.rank]
        exclusive = uses[source.shard] == 1
        if _restore_one(
            store, secret, topology.generation, coord.rank, source, node_rank, servers, exclusive
        ):
            result.local += node_rank in source.holders
            result.fetched += node_rank not in source.holders
            result.from_dp_peer += source.from_dp_peer
        else:
            raise RtrainError(
                f"no intact copy of {source.shard} survives for rank {coord.rank} "
                "(every holder was unreachable or corrupt)"
            )
    result.seconds = time.monotonic() - started
    return result


def _restore_one(
    store: ShardStore,
    secret: bytes,
    generation: int,
    rank: int,
    source: RestoreSource,
    node_rank: int,
    servers: dict[int, tuple[str, int]],
    exclusive: bool,
) -> bool:
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
                if exclusive:  # the common case: no copy at all
                    target = store.adopt(source.shard, generation, rank)
                else:
                    target = store.restore_target(generation, rank, size)
                    memoryview(target)[:size] = memoryview(buffer)[:size]
            else:
                host, port = servers[holder]
                target = _fetch(
                    ShardClient(host, port, secret), store, source.shard, generation, rank
                )
            # Under its new name the shard is not replicated yet: the replicator copies it.
            set_replicated(target, -1)
            target.close()
            return True
        except (OSError, ShardError, KeyError) as exc:
            logger.warning(
                "copy of %s on node %d is unusable (%s); trying the next", source.shard, holder, exc
            )
    return False


def _fetch(
    client: ShardClient, store: ShardStore, shard: ShardId, generation: int, rank: int
) -> Any:
    """Fetch `shard` from a peer straight into the new worker's slot."""
    targets: list[Any] = []

    def into(size: int) -> Any:
        targets.append(store.restore_target(generation, rank, size))
        return targets[-1]

    try:
        client.get(shard, into)
    finally:
        client.close()
    return targets[-1]


def restore_from_disk(
    store: ShardStore, directory: str, topology: Topology, node_rank: int
) -> RestoreResult:
    """Every local rank from the newest complete disk checkpoint (the same on all nodes)."""
    found = newest_complete(directory)
    if found is None:
        logger.info("no complete checkpoint in %s: workers start fresh", directory)
        return RestoreResult(None)
    step, world = found
    for coord in topology.coords:
        if coord.node_rank != node_rank:
            continue
        # A larger world than the checkpoint's takes ranks modulo: DP replicas.
        try:
            data = load_verified(directory, step, coord.rank % world)
        except (OSError, ValueError, KeyError) as exc:
            raise RtrainError(f"cannot restore rank {coord.rank} from {directory}: {exc}") from None
        target = store.restore_target(topology.generation, coord.rank, len(data))
        target[: len(data)] = data
        set_replicated(target, -1)
        target.close()
    return RestoreResult(step, from_disk=directory)
