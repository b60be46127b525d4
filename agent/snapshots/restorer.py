"""Before a generation's workers start: agree on the step to restore and fetch the shards.

Every agent publishes what it holds (its workers' slots, the replicas it keeps), how
far its own workers got, and where its ShardServer listens; once all members have, each
computes the same plan (core.snapshots.restore_plan) and puts each of its new workers' shards
into that worker's slot, from local memory or from a peer, checksum verified. A corrupt
or unreachable copy is reported and the next holder is tried; if a rank has none left,
the agents agree on a new plan without the bad copies (restore_agreed). Then
rtrain.core.restore() in the worker reads its slot.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.errors import RendezvousError, RtrainError
from ...core.layout.topology import Topology
from ...core.rendezvous.protocol import (
    Membership,
    ProtocolError,
    StoreKeys,
    decode_master,
    encode_master,
)
from ...core.snapshots.format import set_replicated
from ...core.snapshots.restore_plan import (
    Lineage,
    Reached,
    RestoreSource,
    ShardId,
    job_ceiling,
    plan_restore,
    snapshots_existed,
)
from ..observe.progress import WaitProgress
from ..rendezvous.job import JobRendezvous
from ..waiting import SYSTEM_CLOCK
from .checksums import verify
from .disk_checkpoints import CheckpointDir, load_verified, newest_complete
from .shard_client import Peers, ShardClient
from .shard_store import ShardStore
from .shard_wire import ShardError

logger = logging.getLogger(__name__)

POLL_S = 0.01
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


@dataclass
class Pooled:
    """What every member published: its shards, its shard server, what it reached."""

    inventory: dict[int, list[ShardId]]
    servers: dict[int, tuple[str, int]]
    reached: dict[int, Reached]


def publish(
    rdzv: JobRendezvous,
    keys: StoreKeys,
    store: ShardStore,
    generation: int,
    node_rank: int,
    address: tuple[str, int],
    reached: Reached,
) -> None:
    shards = [[s.generation, s.rank, s.step] for s in store.inventory()]
    payload = {"shards": shards, "reached": reached.newest, "every_rank": reached.every_rank}
    rdzv.store.set(keys.shards(generation, node_rank), encode_master(*address))
    rdzv.store.set(keys.inventory(generation, node_rank), json.dumps(payload))


def gather(
    rdzv: JobRendezvous,
    keys: StoreKeys,
    membership: Membership,
    timeout: float,
    watch: Callable[[], object] | None = None,
) -> Pooled:
    """Every member's inventory and shard server address (waits until all are in)."""
    generation = membership.generation
    pooled = Pooled({}, {}, {})
    for node, member in enumerate(membership.members):
        key = keys.inventory(generation, node)
        _wait_for(rdzv, key, generation, timeout, watch, f"node {node} did not publish its shards")
        # The server address and the inventory are judged apart: a node whose inventory
        # is refused still gets replicas from its ring predecessors.
        try:
            pooled.servers[node] = decode_master(
                rdzv.store.get(keys.shards(generation, node)) or b""
            )
        except ProtocolError as exc:
            logger.error("refusing node %d's shard server address: %s", node, exc)
        try:
            raw = json.loads(rdzv.store.get(key) or b"")
            pooled.inventory[node] = [ShardId(int(g), int(r), int(s)) for g, r, s in raw["shards"]]
            newest = raw["reached"]
            pooled.reached[node] = Reached(
                None if newest is None else int(newest),
                raw["every_rank"] is True,
                member.prev_rank is not None,
            )
        except (ValueError, TypeError, KeyError) as exc:
            logger.error("refusing node %d's shard inventory: %s", node, exc)
            pooled.inventory[node] = []
            pooled.reached[node] = Reached(was_member=member.prev_rank is not None)
    return pooled


def _wait_for(
    rdzv: JobRendezvous,
    key: str,
    generation: int,
    timeout: float,
    watch: Callable[[], object] | None,
    what: str,
) -> None:
    def there() -> bool:
        if rdzv.store.exists(key):
            return True
        rdzv.rounds.raise_if_ended(generation, watch)
        return False

    if not SYSTEM_CLOCK.wait_until(there, timeout, POLL_S):
        raise RendezvousError(f"{what} for generation {generation}")


def restore_agreed(
    rdzv: JobRendezvous,
    keys: StoreKeys,
    membership: Membership,
    store: ShardStore,
    peers: Peers,
    topology: Topology,
    node_rank: int,
    pooled: Pooled,
    checkpoint_dir: CheckpointDir | None = None,
    timeout: float = 60.0,
    watch: Callable[[], object] | None = None,
    lineage: Mapping[int, Lineage] | None = None,
) -> RestoreResult:
    """Restore this node's ranks at a step every agent agrees on (lineage: whose state
    each rank continues where the topology's grid does not say; see plan_restore).

    Every agent plans from the same inventories, tries its ranks' copies and publishes
    how it went: complete or not, and which copies failed verification or could not be
    fetched. Until every agent is complete, all of them drop the copies any of them
    found bad and plan again: one corrupt copy costs at most a step, never the run.
    """
    started = time.monotonic()
    unusable: set[tuple[ShardId, int]] = set()
    ceiling = job_ceiling(pooled.reached.values())
    members = range(len(membership.members))
    for attempt in range(MAX_ATTEMPTS):
        plan = plan_restore(topology, pooled.inventory, ceiling, unusable, lineage)
        if plan is None:
            result = _without_a_plan(store, topology, node_rank, pooled, checkpoint_dir)
            break
        result, bad, complete = _restore_planned(store, peers, topology, node_rank, plan)
        outcome = {"complete": complete, "bad": [[*_key(s), n] for s, n in sorted(bad, key=str)]}
        rdzv.store.set(
            keys.restore_outcome(topology.generation, node_rank, attempt), json.dumps(outcome)
        )
        all_complete = True
        for node in members:
            key = keys.restore_outcome(topology.generation, node, attempt)
            _wait_for(
                rdzv, key, topology.generation, timeout, watch, f"node {node} did not restore"
            )
            theirs = _read_outcome(rdzv.store.get(key), node)
            all_complete &= theirs[0]
            unusable |= theirs[1]
        if all_complete:
            break
        logger.warning(
            "restore attempt %d at step %d failed on some node; %d bad copies dropped, "
            "planning again",
            attempt + 1,
            plan[0],
            len(unusable),
        )
    else:
        raise RtrainError(f"no restore plan worked in {MAX_ATTEMPTS} attempts")
    result.seconds = time.monotonic() - started
    return result


def _key(shard: ShardId) -> list[int]:
    return [shard.generation, shard.rank, shard.step]


def _read_outcome(payload: Any, node: int) -> tuple[bool, set[tuple[ShardId, int]]]:
    try:
        raw = json.loads(payload)
        bad = {(ShardId(int(g), int(r), int(s)), int(n)) for g, r, s, n in raw["bad"]}
        return raw["complete"] is True, bad
    except (ValueError, TypeError, KeyError) as exc:
        raise RtrainError(f"refusing node {node}'s restore outcome: {exc}") from None


def restore_once(
    store: ShardStore,
    peers: Peers,
    topology: Topology,
    node_rank: int,
    inventory: dict[int, list[ShardId]],
) -> RestoreResult:
    """One attempt at the plan for these inventories, alone (no agreement: tools, tests)."""
    plan = plan_restore(topology, inventory)
    if plan is None:
        return RestoreResult(None)
    result, _, complete = _restore_planned(store, peers, topology, node_rank, plan)
    if not complete:
        raise RtrainError(f"no intact copy of some shard of step {plan[0]} survives")
    return result


def _without_a_plan(
    store: ShardStore,
    topology: Topology,
    node_rank: int,
    pooled: Pooled,
    checkpoint_dir: CheckpointDir | None,
) -> RestoreResult:
    """No step survives in memory for every rank (every agent sees the same, and
    comes here together): the disk checkpoint, a fresh start, or an error."""
    if checkpoint_dir:
        found = restore_from_disk(store, checkpoint_dir, topology, node_rank)
        if found.step is not None:
            return found
    reached = pooled.reached.values()
    if snapshots_existed(reached):
        raise RtrainError(
            f"every rank had snapshots (up to step {job_ceiling(reached)}) but no step every "
            "rank can restore survives: they were destroyed; refusing to start from scratch "
            "(restart the job from a checkpoint, or without snapshots to start over)"
        )
    if any(pooled.inventory.values()):
        logger.warning("no step that every rank can restore survives: workers start fresh")
    return RestoreResult(None)


def _restore_planned(
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
                if exclusive:  # the common case: no copy at all
                    target = store.adopt(source.shard, generation, rank)
                else:
                    target = store.restore_target(generation, rank, size)
                    memoryview(target)[:size] = memoryview(buffer)[:size]
            else:
                host, port = peers.servers[holder]
                client = ShardClient(host, port, peers.secret, peers.source)
                target = _fetch(client, store, source.shard, generation, rank)
            # Under its new name the shard is not replicated yet: the replicator copies it.
            set_replicated(target, -1)
            target.close()
            return holder
        except (OSError, ShardError, KeyError) as exc:
            bad.add((source.shard, holder))
            logger.warning(
                "copy of %s on node %d is unusable (%s); trying the next", source.shard, holder, exc
            )
    return None


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
