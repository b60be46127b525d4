"""Replication: this node's workers' snapshots copied to its ring successors, for one run.

It owns the Replicator (the thread that checksums and sends each committed slot) and
the job-wide interval it feeds under the adapt policy (JobInterval); each generation it
points them at the ring successors (core.snapshots.restore_plan.ring_successors) whose
shard servers the restore pooled, and at each successor's DP twin of every local rank
(a replica sent as the chunks the twin's shard lacks: peers/delta.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ....core.clock import Clock
from ....core.layout.topology import Topology
from ....core.snapshots.redundancy import dp_twin
from ....core.snapshots.restore_plan import ring_successors
from ...rendezvous.job import JobRendezvous
from ...store.kv import KeyValueStore
from ...waiting import SYSTEM_CLOCK
from ..disk.checkpoints import DiskCheckpointer
from ..peers.transport import Address, ShardTransport
from ..shard_store import ShardStore
from .interval import JobInterval
from .replicator import CommitListener, Replicator

logger = logging.getLogger(__name__)


class Replication:
    def __init__(
        self,
        store: ShardStore,
        transport: ShardTransport,
        rdzv: JobRendezvous,
        copies: int,
        dp_delta: bool,
        listener: CommitListener | None = None,
        checkpointer: DiskCheckpointer | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """Starts the replicating thread (idle until follow()). copies: each shard's
        copies, its own among them; dp_delta: replicas against the DP twin; clock: the
        replicator's and the interval's."""
        self._store = store
        self._copies = copies
        self._dp_delta = dp_delta
        self._interval = JobInterval(rdzv.store, rdzv.keys, clock=clock)  # the adapt policy's
        self.replicator = Replicator(
            store,
            transport,
            listener,
            self._interval if self._interval.active else None,
            checkpointer,
            clock,
        )

    @property
    def newest_replicated(self) -> int | None:
        """The newest step sent to every peer; None where no peer is (nothing is held
        elsewhere: `rtrain status` says replicated only where a copy is)."""
        return self.replicator.newest_replicated if self.replicator.has_peers else None

    def use_store(self, store: KeyValueStore) -> None:
        """The job's store carried over to a new one (agent/kube/store_return.py)."""
        self._interval.use_store(store)

    def pause(self) -> None:
        """Stop replicating and agreeing the interval until the next follow()."""
        self.replicator.pause()
        self._interval.pause()

    def agree_interval(self, steps: Sequence[int] = ()) -> None:
        """The job-wide interval's store check, with the steps of this node's workers'
        latest heartbeats (interval.py)."""
        self._interval.poll(steps)

    def follow(
        self,
        generation: int,
        node_rank: int,
        members: int,
        topology: Topology,
        servers: Mapping[int, Address],
        local_ranks: list[int],
        local_world_size: int,
    ) -> None:
        """Replicate this generation's slots to the ring successors among `members`
        nodes whose shard servers are known."""
        targets, successors = [], []
        for successor in ring_successors(node_rank, members, self._copies):
            if successor in servers:
                targets.append(servers[successor])
                successors.append(successor)
            else:  # its address was refused: one copy fewer this generation, not a crash
                logger.error("no replicas go to node %d: its shard server is unknown", successor)
        twins = {
            rank: [
                dp_twin(topology, rank, successor) if self._dp_delta else None
                for successor in successors
            ]
            for rank in local_ranks
        }
        self.replicator.follow(generation, targets, topology.world_size, local_world_size, twins)
        folder = self._store.snap_dir(generation)
        self._interval.follow(generation, node_rank, members, folder, local_ranks)

    def close(self) -> None:
        self.replicator.close()
