"""Before a generation's workers start: agree on the step to restore and fetch the shards.

Every agent publishes what it holds (its workers' slots, the replicas it keeps), how
far its own workers got, and where its ShardServer listens; once all members have, each
computes the same plan (core.snapshots.restore_plan) and puts each of its new workers' shards
into that worker's slot, from local memory or from a peer, checksum verified and checked
as the worker will read it (restore_copies.py). A corrupt, unreadable or unreachable
copy is reported and the next holder is tried; if a rank has none left,
the agents agree on a new plan without the bad copies (restore_agreed). Then
rtrain.core.restore() in the worker reads its slot.
"""

from __future__ import annotations

import json
import logging
import time
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
from ...core.snapshots.restore_plan import (
    Lineage,
    Reached,
    ShardId,
    job_ceiling,
    plan_restore,
    snapshots_existed,
)
from ..rendezvous.job import JobRendezvous
from ..waiting import SYSTEM_CLOCK
from .disk_checkpoints import CheckpointDir
from .peers.client import Peers
from .restore_copies import (
    MAX_ATTEMPTS,
    RestoreResult,
    restore_from_disk,
    restore_once,
    restore_planned,
)
from .shard_store import ShardStore

__all__ = ["Pooled", "RestoreResult", "gather", "publish", "restore_agreed", "restore_once"]

logger = logging.getLogger(__name__)

POLL_S = 0.01


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
        result, bad, complete = restore_planned(store, peers, topology, node_rank, plan)
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
