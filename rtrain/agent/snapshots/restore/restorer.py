"""Before a generation's workers start: agree on the step to restore and fetch the shards.

Every agent publishes what it holds (its workers' slots, the replicas it keeps), how
far its own workers got, and where its ShardServer listens; once all members have, each
computes the same plan (core.snapshots.restore_plan) and puts each of its new workers' shards
into that worker's slot, from local memory or from a peer, checksum verified and checked
as the worker will read it (copies.py). A corrupt, unreadable or unreachable
copy is reported and the next holder is tried; if a rank has none left,
the agents agree on a new plan without the bad copies (Restorer.agree). Then
rtrain.core.restore() in the worker reads its slot.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ....core.clock import Clock
from ....core.errors import RendezvousError, RtrainError
from ....core.layout.topology import NodeSlot, Topology, build_grid, recompute_topology
from ....core.rendezvous.protocol import Membership, ProtocolError, decode_master, encode_master
from ....core.snapshots.carry_over import fill_in
from ....core.snapshots.restore_plan import (
    Lineage,
    Reached,
    ShardId,
    Written,
    job_ceiling,
    plan_restore,
    snapshots_existed,
)
from ....core.snapshots.restore_records import Inventory, RestoreOutcome
from ...rendezvous.job import JobRendezvous
from ...waiting import SYSTEM_CLOCK
from ..disk.checkpoints import CheckpointDir
from ..peers.transport import Peers, ShardTransport
from ..shard_store import ShardStore
from .copies import (
    MAX_ATTEMPTS,
    RestoreResult,
    restore_from_disk,
    restore_planned,
)

logger = logging.getLogger(__name__)

POLL_S = 0.01

# Test only, unset in every real run: the generation at which this agent stops itself
# (SIGSTOP, the whole process) between putting its ranks' shards in place and saying so,
# a node lost mid-restore after the others relabelled theirs
# (tests/integration/test_dcp_skipped_generation.py).
STOP_MID_RESTORE = "RTRAIN_TEST_STOP_MID_RESTORE"


@dataclass(frozen=True)
class RestoreRound:
    """One generation's restore as this node takes part in it: the members, the new
    grid, this node's rank, how long to wait for the others, what ends the wait early
    (watch: raises when the generation is over), and whose state each rank continues
    where the grid does not say (lineage, a ReCycle plan's; see plan_restore)."""

    membership: Membership
    topology: Topology
    node_rank: int
    timeout: float
    watch: Callable[[], object] | None = None
    lineage: Mapping[int, Lineage] | None = None

    @property
    def generation(self) -> int:
        return self.membership.generation


@dataclass(frozen=True)
class Pooled:
    """What every member published: its shards, its shard server, what it reached."""

    inventory: dict[int, list[ShardId]]
    servers: dict[int, tuple[str, int]]
    reached: dict[int, Reached]
    loaded: dict[int, Written]  # where each node's workers' last restored save was written


class Restorer:
    """This node's part in each generation's agreed restore, for one run.

    It holds what every restore uses (the store the agents agree through, this node's
    shards, how it reaches its peers' shard servers, the disk checkpoint of last
    resort, the clock); each generation brings a RestoreRound.
    """

    def __init__(
        self,
        rdzv: JobRendezvous,
        store: ShardStore,
        transport: ShardTransport,
        checkpoint_dir: CheckpointDir | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """transport: how this node fetches its peers' shards (peers/transport.py)."""
        self._rdzv = rdzv
        self._keys = rdzv.keys
        self._store = store
        self._transport = transport
        self._checkpoint_dir = checkpoint_dir
        self._clock = clock

    def restore(
        self,
        round_: RestoreRound,
        server: tuple[str, int],
        reached: Reached,
        loaded: Written | None = None,
    ) -> tuple[Pooled, RestoreResult]:
        """Publish this node's inventory and shard server, pool everyone's, and restore
        this node's new ranks at the step every agent agrees on. loaded: where the save
        this node's workers were last restored to was written."""
        self.publish(round_, server, reached, loaded)
        pooled = self.gather(round_)
        return pooled, self.agree(round_, pooled)

    def publish(
        self,
        round_: RestoreRound,
        server: tuple[str, int],
        reached: Reached,
        loaded: Written | None = None,
    ) -> None:
        shards = tuple(self._store.inventory())
        inventory = Inventory(shards, reached.newest, reached.every_rank, loaded)
        store, keys, generation = self._rdzv.store, self._keys, round_.generation
        store.set(keys.shards(generation, round_.node_rank), encode_master(*server))
        store.set(keys.inventory(generation, round_.node_rank), inventory.encode())

    def gather(self, round_: RestoreRound) -> Pooled:
        """Every member's inventory and shard server address (waits until all are in)."""
        generation = round_.generation
        pooled = Pooled({}, {}, {}, {})
        for node, member in enumerate(round_.membership.members):
            key = self._keys.inventory(generation, node)
            self._wait_for(round_, key, f"node {node} did not publish its shards")
            # The server address and the inventory are judged apart: a node whose
            # inventory is refused still gets replicas from its ring predecessors.
            try:
                address = self._rdzv.store.get(self._keys.shards(generation, node)) or b""
                pooled.servers[node] = decode_master(address)
            except ProtocolError as exc:
                logger.error("refusing node %d's shard server address: %s", node, exc)
            was_member = member.prev_rank is not None
            try:
                inventory = Inventory.decode(self._rdzv.store.get(key) or b"")
            except ProtocolError as exc:
                logger.error("refusing node %d's shard inventory: %s", node, exc)
                inventory = Inventory(())
            pooled.inventory[node] = list(inventory.shards)
            pooled.reached[node] = inventory.reached(was_member)
            if inventory.loaded is not None:
                pooled.loaded[node] = inventory.loaded
        return pooled

    def agree(self, round_: RestoreRound, pooled: Pooled) -> RestoreResult:
        """Restore this node's ranks at a step every agent agrees on.

        Every agent plans from the same inventories, tries its ranks' copies and
        publishes how it went: complete or not, and which copies failed verification or
        could not be fetched. Until every agent is complete, all of them drop the copies
        any of them found bad and plan again: one corrupt copy costs at most a step,
        never the run.
        """
        started = self._clock.now()
        topology, node_rank = round_.topology, round_.node_rank
        peers = Peers(self._transport, pooled.servers)
        unusable: set[tuple[ShardId, int]] = set()
        ceiling = job_ceiling(pooled.reached.values())
        inventory, real, source = self._carried(round_, pooled)
        names: dict[ShardId, list[ShardId]] = {}
        for name, shard in real.items():
            names.setdefault(shard, []).append(name)
        for attempt in range(MAX_ATTEMPTS):
            refused = {(n, node) for s, node in unusable for n in names.get(s, [s])}
            plan = plan_restore(topology, inventory, ceiling, refused, round_.lineage)
            if plan is not None and real:  # the carried names back to the real shards
                sources = plan[1].items()
                plan = plan[0], {r: replace(s, shard=real[s.shard]) for r, s in sources}
            if plan is None:
                result = self._without_a_plan(round_, pooled)
                break
            result, bad, complete = restore_planned(self._store, peers, topology, node_rank, plan)
            _stop_mid_restore(round_.generation)
            mine = RestoreOutcome(complete, frozenset(bad))
            self._rdzv.store.set(self._outcome_key(round_, node_rank, attempt), mine.encode())
            outcomes = [self._outcome(round_, node, attempt) for node in self._members(round_)]
            for theirs in outcomes:
                unusable |= theirs.bad
            if all(theirs.complete for theirs in outcomes):
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
        result.seconds = self._clock.now() - started
        if source is not None and result.step is not None and not result.from_disk:
            # a resharding load names the shards it reads by this generation: the later
            # ones hold relabelled copies of them only, of some of the save's writers
            result.read_from = source
        return result

    def _carried(
        self, round_: RestoreRound, pooled: Pooled
    ) -> tuple[Mapping[int, list[ShardId]], dict[ShardId, ShardId], int | None]:
        """The pooled inventory as plan_restore reads it, each carried name -> its real
        shard, and the generation whose shards were carried (None: nothing carried).

        A generation that ended before its restore relabelled nothing, and one that
        ended in it (some nodes lost before saying theirs was done) relabelled some of
        its ranks' shards only: its successor finds no shards of it, or an incomplete
        set. Back to the newest generation that holds shards and did not end in its
        restore, its shards are carried over the ones after it, filling in what they
        lack rank by rank and step by step (core/snapshots/carry_over.py)."""
        previous = round_.generation - 1
        generations = {s.generation for shards in pooled.inventory.values() for s in shards}
        source = previous
        while any(g < source for g in generations) and (
            source not in generations or self._ended_in_restore(source, pooled.inventory)
        ):
            source -= 1
        if source == previous:
            return pooled.inventory, {}, None
        layout = round_.topology.layout
        grids: list[Topology] = []
        for generation in range(source, previous + 1):
            members = self._rdzv.rounds.read_membership(generation).members
            slots = [NodeSlot(m.node_id, m.local_world_size) for m in members]
            before = grids[-1] if grids else None
            grid = build_grid(layout, generation, slots)
            grids.append(
                grid if before is None else recompute_topology(layout, generation, slots, before)
            )
        ended = ", ".join(str(g) for g in range(source + 1, previous + 1))
        logger.warning(
            "generation %s did not complete its restore (ended as it started, or in it): "
            "restoring generation %d's shards carried over to its ranks, wherever a later "
            "generation holds none of the same rank and step",
            ended,
            source,
        )
        inventory, real = fill_in(pooled.inventory, source, grids[1:])
        return inventory, real, source

    def _ended_in_restore(self, generation: int, inventory: Mapping[int, list[ShardId]]) -> bool:
        """Whether `generation` tried a restore plan (some node said how its attempt
        went) and no attempt was done on every member: it ended in its restore, its
        workers never started, and its shards are relabelled copies only. The outcomes
        are not read while its shards hold a step of every one of its ranks."""
        members = self._rdzv.rounds.read_membership(generation).members
        world = sum(m.local_world_size for m in members)
        ranks: dict[int, set[int]] = {}
        for shards in inventory.values():
            for shard in shards:
                if shard.generation == generation:
                    ranks.setdefault(shard.step, set()).add(shard.rank)
        if any(len(held) == world for held in ranks.values()):
            return False
        store = self._rdzv.store
        for attempt in range(MAX_ATTEMPTS):
            keys = [self._keys.restore_outcome(generation, n, attempt) for n in range(len(members))]
            there = [k for k in keys if store.exists(k)]
            if len(there) < len(keys):  # no node goes on to the next attempt before
                return attempt > 0 or bool(there)
            if all(self._complete(store.get(k)) for k in keys):
                return False
        return True

    @staticmethod
    def _complete(payload: bytes | None) -> bool:
        try:
            return RestoreOutcome.decode(payload or b"").complete
        except ProtocolError:
            return False

    def _members(self, round_: RestoreRound) -> range:
        return range(len(round_.membership.members))

    def _outcome_key(self, round_: RestoreRound, node: int, attempt: int) -> str:
        return self._keys.restore_outcome(round_.topology.generation, node, attempt)

    def _outcome(self, round_: RestoreRound, node: int, attempt: int) -> RestoreOutcome:
        """Node `node`'s outcome of this attempt, once it is in."""
        key = self._outcome_key(round_, node, attempt)
        self._wait_for(round_, key, f"node {node} did not restore")
        try:
            return RestoreOutcome.decode(self._rdzv.store.get(key) or b"")
        except ProtocolError as exc:
            raise RtrainError(f"refusing node {node}'s restore outcome: {exc}") from None

    def _wait_for(self, round_: RestoreRound, key: str, what: str) -> None:
        generation = round_.generation

        def there() -> bool:
            if self._rdzv.store.exists(key):
                return True
            self._rdzv.workers.raise_if_ended(generation, round_.watch)
            return False

        if not self._clock.wait_until(there, round_.timeout, POLL_S):
            raise RendezvousError(f"{what} for generation {generation}")

    def _without_a_plan(self, round_: RestoreRound, pooled: Pooled) -> RestoreResult:
        """No step survives in memory for every rank (every agent sees the same, and
        comes here together): the disk checkpoint, a fresh start, or an error."""
        if self._checkpoint_dir:
            found = restore_from_disk(
                self._store, self._checkpoint_dir, round_.topology, round_.node_rank
            )
            if found.step is not None:
                return found
        reached = pooled.reached.values()
        if snapshots_existed(reached):
            raise RtrainError(
                f"every rank had snapshots (up to step {job_ceiling(reached)}) but no step "
                "every rank can restore survives: they were destroyed; refusing to start from "
                "scratch (restart the job from a checkpoint, or without snapshots to start over)"
            )
        if any(pooled.inventory.values()):
            logger.warning("no step that every rank can restore survives: workers start fresh")
        return RestoreResult(None)


def _stop_mid_restore(generation: int) -> None:
    if os.environ.get(STOP_MID_RESTORE) == str(generation):
        logger.warning("%s=%d: stopping this agent mid-restore", STOP_MID_RESTORE, generation)
        os.kill(os.getpid(), signal.SIGSTOP)
