"""SnapshotService: the agent's side of in-memory snapshots, for one run.

It owns the shard store on /dev/shm, the ShardServer peers fetch from and replicate
to, and the Replicator; at each generation start it restores the new workers' state
(agent/snapshots/restorer.py) and points the replicator at the ring successors.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...core.clock import Clock
from ...core.config.component_specs import SnapshotPart
from ...core.config.worker_env import SNAPSHOT_BUDGET, SNAPSHOT_DIR
from ...core.layout.topology import Topology
from ...core.rendezvous.protocol import Membership
from ...core.snapshots.admission import Admission
from ...core.snapshots.format import SLOTS_PER_RANK
from ...core.snapshots.redundancy import dp_twin
from ...core.snapshots.restore_plan import (
    Lineage,
    Reached,
    Written,
    ring_successors,
    written_in,
)
from ..observe.events import emit
from ..rendezvous.job import JobRendezvous
from ..waiting import SYSTEM_CLOCK
from .disk_checkpoints import DiskCheckpointer, open_checkpoint_dir
from .disk_save import save_slots
from .interval import JobInterval
from .peers.fetcher import FetchContext, PeerFetcher, holders_of
from .peers.server import ShardServer
from .replicator import Replicator
from .restore_copies import RestoreResult
from .restorer import Pooled, Restorer, RestoreRound
from .shard_store import KEEP_STEPS, ShardStore
from .spare_pool import SpareFiller

logger = logging.getLogger(__name__)

SPARE_SLACK = 16  # a spare holds the largest local shard and this fraction more
SPARE_ROUND = 1 << 20


class SnapshotService:
    def __init__(
        self,
        root: str,
        host: str,
        part: SnapshotPart,
        secret: bytes | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """part: the snapshot settings (core/config/component_specs.py); its memory, or
        half of the shared memory under root, is the budget. secret: the job secret, or
        None to hand a random one out through the store; clock: the restore's."""
        settings = part.snapshots
        budget = settings.memory or default_budget(root)
        self._dp_delta = settings.dp_delta  # replicas against the DP twin (peers/delta.py)
        self._clock = clock
        self.store = ShardStore(root, budget)
        # Signed with the secret given, else with the folder's own key: a secret handed
        # out through the store dies with it, and a requeued job must read its checkpoints.
        folder = settings.checkpoint_dir
        self._checkpoint_dir = open_checkpoint_dir(folder, secret) if folder else None
        self._checkpointer = (
            DiskCheckpointer(
                self._checkpoint_dir, settings.checkpoint_every, settings.keep_checkpoints
            )
            if self._checkpoint_dir and settings.checkpoint_every
            else None
        )
        self._host = host
        self._budget = budget
        self._copies = settings.copies
        self._secret = secret
        self._admission = Admission()
        self._local_ranks: list[int] = []
        self._local_steps: dict[int, int] = {}  # this generation's ranks: newest committed
        self._server: ShardServer | None = None
        self._replicator: Replicator | None = None
        self._interval: JobInterval | None = None  # the adapt policy's job-wide interval
        self._restorer: Restorer | None = None
        self._rdzv: JobRendezvous | None = None  # the rendezvous the restorer reads
        self._fetcher = PeerFetcher(self.store)
        self._spares = SpareFiller(self.store.pool, self._spare_sizing)
        self._spares_for: int | None = None  # the generation the spares were sized in
        self._loaded: Written | None = None  # where the save last restored was written
        self._generation: int | None = None  # the generation the workers now run
        self.restored_step: int | None = None  # the step this generation's workers resume after
        self._world_size = 0
        self._per_slot = 0  # bytes each snapshot slot may take this generation
        self._snapshotted = False  # a worker of this run committed a snapshot

    @classmethod
    def for_launch(
        cls, part: SnapshotPart, runtime_dir: str, addr: str, secret: bytes | None
    ) -> SnapshotService:
        """The service a launch asks for, its shards in <runtime_dir>/shards."""
        root = os.path.join(runtime_dir, "shards")
        os.makedirs(root)
        return cls(root, addr if addr != "localhost" else "127.0.0.1", part, secret)

    def _start(self, rdzv: JobRendezvous) -> None:
        """The job secret as given (agent/snapshots/job_secret.py), else one random value the first
        agent sets in the store."""
        if self._secret is None:
            self._secret = rdzv.store.set_once(rdzv.keys.secret, secrets.token_hex(32))
        self._server = ShardServer(self._host, self._secret, self.store, self._admission)
        self._rdzv = rdzv
        self._restorer = Restorer(
            rdzv, self.store, self._secret, self._host, self._checkpoint_dir, self._clock
        )
        self._interval = JobInterval(rdzv.store, rdzv.keys)
        self._replicator = Replicator(
            self.store,
            self._secret,
            self._checkpointer,
            source=self._host,
            on_local_step=self._on_local_step,
            on_pass=self._fetcher.poll,
            on_interval=self._interval.note if self._interval.active else None,
        )

    def _on_local_step(self, rank: int, step: int) -> None:
        """A worker of this node committed `step` (from the replicator's thread)."""
        self._admission.ceiling.observe(step)
        self._local_steps[rank] = max(step, self._local_steps.get(rank, step))
        self._fetcher.committed(step)  # a newer step: the prefetched shards were read
        if self._spares_for != self._generation:  # its shards' size is known now
            self._spares_for = self._generation
            self._spares.ask()
        if not self._snapshotted:
            self._snapshotted = True
            self._say_memory()

    def _say_memory(self) -> None:
        """The memory line, for a job that snapshots: at its first commit, then at each
        generation start (a job that never calls snapshot() never sees it)."""
        logger.info(
            "snapshot memory: %.1f MiB in use, budget %.1f MiB (%.1f MiB per snapshot slot)",
            self.store.used_bytes() / 2**20,
            self._budget / 2**20,
            self._per_slot / 2**20,
        )

    def _catch_up(self) -> None:
        """Count the steps the last generation's workers committed that the replicator
        had not seen yet (it polls, and is paused now). A worker that dies right after a
        commit leaves a step every rank has; missing it here would put the job's ceiling
        one step low and make every rank restore the step before."""
        if self._generation is None:
            return
        for shard, _ in self.store.local_slots():
            if shard.generation == self._generation:
                self._on_local_step(shard.rank, shard.step)

    def progress(self) -> tuple[int | None, int | None]:
        """(the newest step this node's workers committed, the newest replicated)."""
        replicated = self._replicator.newest_replicated if self._replicator else None
        return self._admission.ceiling.newest, replicated

    def agree_interval(self, steps: Sequence[int] = ()) -> None:
        """The adapt policy's job-wide snapshot interval (agent/snapshots/interval.py):
        called at the generation monitor's store checks, with the steps of this node's
        workers' latest heartbeats."""
        if self._interval is not None:
            self._interval.poll(steps)

    def _spare_sizing(self) -> tuple[int, int, int]:
        """The spare slots restores receive into: one per local rank, as large as the
        largest shard they committed and a sixteenth more, within what the budget
        leaves free. The slack: a resharding load fetches other ranks' shards, whose
        sizes differ by a few rows (FSDP2 over 3 ranks: another rank's 200.7 MiB shard
        did not fit this one's spare: fresh memory, 2.0 s against 0.8 s)."""
        largest = self.store.largest_slot(self._generation)
        size = -(-(largest + largest // SPARE_SLACK) // SPARE_ROUND) * SPARE_ROUND
        return len(self._local_ranks), size, max(self._budget - self.store.used_bytes(), 0)

    def _reached(self) -> Reached:
        """How far this node's own workers got, for the next restore plan."""
        every = bool(self._local_ranks) and all(r in self._local_steps for r in self._local_ranks)
        return Reached(self._admission.ceiling.newest, every)

    def prepare(
        self,
        rdzv: JobRendezvous,
        membership: Membership,
        topology: Topology,
        node_rank: int,
        local_world_size: int,
        timeout: float,
        watch: Callable[[], object] | None = None,
        lineage: Mapping[int, Lineage] | None = None,
    ) -> dict[str, str]:
        """Restore this node's new workers; the environment that points them at their slots.
        lineage: whose state each rank continues where the grid does not say (ReCycle)."""
        if self._server is None:
            self._start(rdzv)
        elif rdzv is not self._rdzv and self._secret is not None:
            # the job's store carried over to a new one (agent/kube/store_return.py)
            self._rdzv = rdzv
            if self._interval is not None:
                self._interval.use_store(rdzv.store)
            self._restorer = Restorer(
                rdzv, self.store, self._secret, self._host, self._checkpoint_dir, self._clock
            )
        assert self._server is not None and self._restorer is not None
        round_ = RestoreRound(membership, topology, node_rank, timeout, watch, lineage)
        self._end_generation(round_)
        reached = self._reached()
        server = (self._host, self._server.port)
        pooled, result = self._restorer.restore(round_, server, reached, self._loaded)
        # only now: a generation that ended in its restore leaves them to the next
        self._local_steps = {}
        self._restored(result, [c.rank for c in topology.coords if c.node_rank == node_rank])
        self._loaded = self._written(round_.generation, result, pooled)
        self._follow(round_, pooled, local_world_size)
        self.store.recycle(round_.generation, self._local_ranks, result.step)
        self.store.prune(keep_from=round_.generation - 1, keep=self._loaded)
        # each rank's own slots, and the newest KEEP_STEPS replicas of each of copies-1 peers
        shares = SLOTS_PER_RANK + KEEP_STEPS * (self._copies - 1)
        self._per_slot = per_slot = self._budget // max(local_world_size * shares, 1)
        # Shards held, not bytes used: the interval file the workers are handed sits in
        # their slot folder from the start, snapshots or not.
        if self._snapshotted or self.store.local_slots() or self.store.replicas():
            self._say_memory()
        return {
            SNAPSHOT_DIR: self.store.snap_dir(round_.generation),
            SNAPSHOT_BUDGET: str(per_slot),
        }

    def _end_generation(self, round_: RestoreRound) -> None:
        """Stop serving the last generation: replication paused, its last commits
        counted, no fetches for its workers; serve the new one's members."""
        assert self._replicator is not None
        self._replicator.pause()
        if self._interval is not None:
            self._interval.pause()
        self._catch_up()
        self._fetcher.follow(None)
        self._generation, self._world_size = round_.generation, round_.topology.world_size
        self._admit(round_.membership, round_.node_rank)

    def _restored(self, result: RestoreResult, local_ranks: list[int]) -> None:
        """Say what the restore did, and count its step as this node's workers' own."""
        logger.info("%s", result.describe())
        source = "none" if result.step is None else "disk" if result.from_disk else "memory"
        emit(
            "restore",
            step=result.step,
            source=source,
            local=result.local,
            fetched=result.fetched,
            from_dp_peer=result.from_dp_peer,
            seconds=round(result.seconds, 6),
        )
        self.restored_step = result.step
        self._local_ranks = local_ranks
        if result.step is not None:
            self._admission.ceiling.observe(result.step)
            self._local_steps = dict.fromkeys(local_ranks, result.step)

    def _written(self, generation: int, result: RestoreResult, pooled: Pooled) -> Written | None:
        """Where the save this generation's workers were restored to was written: kept
        until a restore finds a newer step, so that a resharding load can read it again
        after a second failure before a save every rank has."""
        if result.step is None or result.from_disk:
            return None
        loaded = pooled.loaded.values()
        written = written_in(generation, result.step, loaded, result.read_from)
        if written.generation < generation - 1:
            logger.info(
                "keeping the shards of step %d written in generation %d: no save every "
                "rank has followed the load that read them",
                written.step,
                written.generation,
            )
        return written

    def _follow(self, round_: RestoreRound, pooled: Pooled, local_world_size: int) -> None:
        """Point the replicator at this generation's ring successors and the fetcher at
        its holders of each shard."""
        assert self._replicator is not None and self._secret is not None
        node_rank, topology = round_.node_rank, round_.topology
        count = len(round_.membership.members)
        targets, successors = [], []
        for successor in ring_successors(node_rank, count, self._copies):
            if successor in pooled.servers:
                targets.append(pooled.servers[successor])
                successors.append(successor)
            else:  # its address was refused: one copy fewer this generation, not a crash
                logger.error("no replicas go to node %d: its shard server is unknown", successor)
        self._fetcher.follow(
            FetchContext(
                round_.generation,
                node_rank,
                self._local_ranks,
                holders_of(pooled.inventory),
                pooled.servers,
                self._secret,
                self._host,
                self._loaded,
                world_size=topology.world_size,
            )
        )
        self._fetcher.prefetch()  # the shards a resharding load will read, before it runs
        twins = {
            rank: [
                dp_twin(topology, rank, successor) if self._dp_delta else None
                for successor in successors
            ]
            for rank in self._local_ranks
        }
        self._replicator.follow(
            round_.generation, targets, topology.world_size, local_world_size, twins
        )
        if self._interval is not None:
            folder = self.store.snap_dir(round_.generation)
            self._interval.follow(round_.generation, node_rank, count, folder, self._local_ranks)

    def _admit(self, membership: Membership, node_rank: int) -> None:
        """From now on serve this generation: replicas from the nodes placement sends
        them from, shards to its members only."""
        count = len(membership.members)
        senders = [
            m.addr
            for n, m in enumerate(membership.members)
            if node_rank in ring_successors(n, count, self._copies)
        ]
        self._admission.readers = frozenset(addresses_of(m.addr for m in membership.members))
        self._admission.senders = frozenset(addresses_of(senders))
        self._admission.generation = membership.generation

    def save_to_disk(self) -> int | None:
        """Write this node's workers' snapshots to --checkpoint-dir now (a Slurm job about
        to be stopped); the newest step written, or None (disk_save.py). Call with the
        workers stopped."""
        if not self._checkpoint_dir or self._generation is None:
            return None
        return save_slots(self.store, self._checkpoint_dir, self._generation, self._world_size)

    @property
    def secret(self) -> bytes | None:
        """The job secret (None until the first generation starts, if none was given)."""
        return self._secret

    def close(self) -> None:
        self._spares.close()
        if self._replicator is not None:
            self._replicator.close()
        if self._server is not None:
            self._server.close()
        if self._checkpointer is not None:
            self._checkpointer.close()


def addresses_of(names: Iterable[str]) -> set[str]:
    """The IP addresses peers connect from, for each node address (a name or an IP)."""
    found: set[str] = set()
    for name in names:
        name = "127.0.0.1" if name == "localhost" else name
        found.add(name)
        try:
            found.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            logger.warning("cannot resolve node address %s", name)
    return found


def default_budget(root: str) -> int:
    """Half of the shared-memory file system the shards live on."""
    stats = os.statvfs(root)
    return stats.f_frsize * stats.f_blocks // 2
