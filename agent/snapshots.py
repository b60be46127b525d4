"""SnapshotService: the agent's side of in-memory snapshots, for one run.

It owns the shard store on /dev/shm, the ShardServer peers fetch from and replicate
to, and the Replicator; at each generation start it restores the new workers' state
(agent/restorer.py) and points the replicator at the ring successors.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable

from rtrain.agent.disk_checkpoints import DiskCheckpointer, write_checkpoint
from rtrain.agent.rendezvous import StoreRendezvous
from rtrain.agent.replicator import Replicator
from rtrain.agent.restorer import gather, publish, restore_local_ranks
from rtrain.agent.shard_server import ShardServer
from rtrain.agent.shard_store import ShardStore
from rtrain.core.launch_spec import LaunchSpec
from rtrain.core.restore_plan import ring_successors
from rtrain.core.snapshot_api import SNAPSHOT_BUDGET, SNAPSHOT_DIR
from rtrain.core.snapshot_format import COMMITTED, checksums, read_header
from rtrain.core.store_protocol import Membership, StoreKeys
from rtrain.core.topology import Topology

logger = logging.getLogger(__name__)


class SnapshotService:
    def __init__(
        self,
        root: str,
        host: str,
        budget: int,
        copies: int,
        run_id: str,
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 0,
    ) -> None:
        self.store = ShardStore(root, budget)
        self._checkpoint_dir = checkpoint_dir
        self._checkpointer = (
            DiskCheckpointer(checkpoint_dir, checkpoint_every)
            if checkpoint_dir and checkpoint_every
            else None
        )
        self._host = host
        self._budget = budget
        self._copies = copies
        self._keys = StoreKeys(run_id)
        self._secret: bytes | None = None
        self._server: ShardServer | None = None
        self._replicator: Replicator | None = None
        self._generation: int | None = None  # the generation the workers now run
        self._world_size = 0

    @classmethod
    def for_launch(cls, spec: LaunchSpec, runtime_dir: str, addr: str) -> SnapshotService:
        """The service a launch asks for, its shards in <runtime_dir>/shards."""
        root = os.path.join(runtime_dir, "shards")
        os.makedirs(root)
        return cls(
            root,
            addr if addr != "localhost" else "127.0.0.1",
            spec.snapshots.memory or default_budget(root),
            spec.snapshots.copies,
            spec.rdzv.run_id,
            spec.snapshots.checkpoint_dir,
            spec.snapshots.checkpoint_every,
        )

    def _start(self, rdzv: StoreRendezvous) -> None:
        """The job secret: RTRAIN_SECRET, else one random value the first agent sets."""
        given = os.environ.get("RTRAIN_SECRET")
        if given:
            self._secret = given.encode()
        else:
            value = rdzv.call("compare_set", self._keys.secret, "", secrets.token_hex(32))
            self._secret = value if isinstance(value, bytes) else str(value).encode()
        self._server = ShardServer(self._host, self._secret, self.store)
        self._replicator = Replicator(self.store, self._secret, self._checkpointer)

    def prepare(
        self,
        rdzv: StoreRendezvous,
        membership: Membership,
        topology: Topology,
        node_rank: int,
        local_world_size: int,
        timeout: float,
        watch: Callable[[], object] | None = None,
    ) -> dict[str, str]:
        """Restore this node's new workers; the environment that points them at their slots."""
        if self._server is None:
            self._start(rdzv)
        assert self._server is not None and self._replicator is not None
        assert self._secret is not None
        generation = membership.generation
        self._generation, self._world_size = generation, topology.world_size
        publish(rdzv, self._keys, self.store, generation, node_rank, self._host, self._server.port)
        inventory, servers = gather(rdzv, self._keys, membership, timeout, watch)
        result = restore_local_ranks(
            self.store, self._secret, topology, node_rank, inventory, servers, self._checkpoint_dir
        )
        logger.info("%s", result.describe())
        successors = ring_successors(node_rank, len(membership.members), self._copies)
        self._replicator.follow(
            generation, [servers[n] for n in successors], topology.world_size, local_world_size
        )
        local_ranks = [c.rank for c in topology.coords if c.node_rank == node_rank]
        self.store.recycle(generation, local_ranks, result.step)
        self.store.prune(keep_from=generation - 1)
        per_slot = self._budget // max(local_world_size * 2 * self._copies, 1)
        logger.info(
            "snapshot memory: %.1f MiB in use, budget %.1f MiB (%.1f MiB per snapshot slot)",
            self.store.used_bytes() / 2**20,
            self._budget / 2**20,
            per_slot / 2**20,
        )
        return {SNAPSHOT_DIR: self.store.snap_dir(generation), SNAPSHOT_BUDGET: str(per_slot)}

    def save_to_disk(self) -> int | None:
        """Write this node's workers' snapshots to --checkpoint-dir now (a Slurm job about
        to be stopped); the newest step written, or None. Both slots of every rank go,
        so the ranks of all nodes share a complete step. Call with the workers stopped:
        a slot being rewritten must not be copied."""
        if not self._checkpoint_dir or self._generation is None:
            return None
        steps = []
        for shard, path in self.store.local_slots():
            if shard.generation != self._generation:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            header = read_header(data)
            if header is None or header.state != COMMITTED or header.step != shard.step:
                continue
            data = data[: header.size]
            write_checkpoint(
                self._checkpoint_dir,
                shard.rank,
                shard.step,
                self._world_size,
                data,
                checksums(data, len(data)),
            )
            steps.append(shard.step)
        return max(steps, default=None)

    def close(self) -> None:
        if self._replicator is not None:
            self._replicator.close()
        if self._server is not None:
            self._server.close()
        if self._checkpointer is not None:
            self._checkpointer.close()


def default_budget(root: str) -> int:
    """Half of the shared-memory file system the shards live on."""
    stats = os.statvfs(root)
    return stats.f_frsize * stats.f_blocks // 2
