"""GenerationStarter: everything one node does to start a generation's workers.

Its name in the job, the peers' leases, the grid, the workers' store, the ReCycle
plan, the restore of every new worker's snapshot, heartbeat files, and the worker
group (built here; the agent starts it).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any, Protocol

from ..core.clock import Clock
from ..core.config.launch_spec import LaunchSpec
from ..core.config.worker_env import NodeAssignment
from ..core.rendezvous.protocol import Membership
from .faults import FaultPolicy
from .generation import (
    Generation,
    Joined,
    generation_topology,
    membership_rank,
    previous_grid,
    write_topology,
)
from .observe import log
from .recycle_plans import plan_generation
from .rendezvous.job import JobRendezvous
from .rendezvous.lease import Leases, PeerWatch
from .runtime_dir import make_folder
from .snapshots.restore.restorer import RestoreRound
from .snapshots.service import SnapshotService
from .store.opening import host_store
from .waiting import SYSTEM_CLOCK
from .workers.group import SpareSpawner, WorkerGroup
from .workers.hang_watch import HangWatch
from .workers.log_tail import LogTail
from .workers.pool import WorkerPool

logger = logging.getLogger(__name__)


class Starts(Protocol):
    """What the agent's loop asks of a generation's starter: GenerationStarter, or a unit
    test's that starts no worker processes (tests/unit/agent/test_agent_loop.py)."""

    joined: Joined | None  # the last generation this node joined

    def start(
        self,
        rdzv: JobRendezvous,
        membership: Membership,
        previous: Generation | None,
        policy: FaultPolicy,
        leases: Leases,
    ) -> Generation: ...

    def spare_spawner(self) -> SpareSpawner: ...


class GenerationStarter:
    def __init__(
        self,
        spec: LaunchSpec,
        node_id: str,
        addr: str,
        nproc: int,
        pool: WorkerPool,
        tail: LogTail,
        base_env: dict[str, str],
        run_log_dir: str,
        runtime_dir: str,
        snapshots: SnapshotService,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.spec = spec
        self.node_id = node_id
        self.addr = addr
        self.nproc = nproc
        self._pool = pool
        self._tail = tail
        self._base_env = base_env
        self.run_log_dir = run_log_dir
        self._runtime_dir = runtime_dir
        self._snapshots = snapshots
        self._clock = clock  # the hang watch's and the worker group's
        # The last generation this node joined, even one that ended before it started.
        self.joined: Joined | None = None
        self._worker_store_handle: Any = None  # the TCPStore this node hosts for its workers
        self._hangs: HangWatch | None = None  # the last generation's (its heartbeat files)
        self._old_beats: str | None = None  # the heartbeat folder of the generation before

    def start(
        self,
        rdzv: JobRendezvous,
        membership: Membership,
        previous: Generation | None,
        policy: FaultPolicy,
        leases: Leases,
    ) -> Generation:
        """The new generation, its workers ready to start; GenerationEnded if a member
        was lost meanwhile."""
        generation = membership.generation
        node_rank, peers = self._take_part(membership, leases)

        def watch() -> bool:  # a member lost while the generation starts ends it
            return policy.check_leases(membership, node_rank, peers)

        before = previous_grid(rdzv, self.spec.layout, membership, previous)
        topology = generation_topology(self.spec.layout, membership, before)
        logger.info("generation %d layout: %s", generation, topology.summary())
        assignment = membership.assignment(
            self.node_id, *self._worker_store(rdzv, generation, node_rank, watch)
        )
        logger.info(
            "generation %d: %d nodes, world size %d, this node rank %d, worker store %s:%d",
            generation,
            assignment.num_nodes,
            assignment.world_size,
            node_rank,
            assignment.master_addr,
            assignment.master_port,
        )
        folder, topology_env = write_topology(self.run_log_dir, topology)
        planned = plan_generation(rdzv, self.spec, folder, topology, before, previous)
        timeout = self.spec.rdzv.join_timeout
        restore = RestoreRound(membership, topology, node_rank, timeout, watch, planned.lineage)
        snapshot_env = self._snapshots.prepare(restore, self.nproc)
        hangs = self._hang_watch(generation)

        def extra_env(local_rank: int, log_dir: str) -> dict[str, str]:
            return {
                **topology_env,
                **planned.env,
                **snapshot_env,
                **hangs.worker_env(local_rank, log_dir),
            }

        self._pool.ensure_running()
        group = WorkerGroup(
            self._pool,
            self.spec,
            assignment,
            self.run_log_dir,
            self._base_env,
            self._tail,
            extra_env,
            hangs,
            self._clock,
        )
        store = self._worker_store_handle
        return Generation(membership, node_rank, group, peers, hangs, topology, planned.plan, store)

    def spare_spawner(self) -> SpareSpawner:
        """How a standby node starts warm spares for its workers (--spares-per-node): as
        a group of no generation yet (-1), whose variables the takeover replaces."""
        waiting = NodeAssignment(-1, -1, 1, self.nproc, 0, self.nproc, "", 0)
        self._pool.ensure_running()
        group = WorkerGroup(
            self._pool, self.spec, waiting, self.run_log_dir, self._base_env, self._tail
        )
        return group.spare_spawner()

    def _take_part(self, membership: Membership, leases: Leases) -> tuple[int, PeerWatch]:
        """This node's rank in the generation, its lease held, its peers' leases watched."""
        generation = membership.generation
        log.set_generation(generation)
        node_rank = membership_rank(membership, self.node_id)
        log.set_node_rank(node_rank)
        peers = leases.peers(generation, node_rank, len(membership.members))
        self.joined = Joined(membership, node_rank, peers)
        leases.hold(generation, node_rank)
        return node_rank, peers

    def _hang_watch(self, generation: int) -> HangWatch:
        """The generation's heartbeat files, in memory-backed storage where there is some."""
        beat_dir = os.path.join(self._runtime_dir, f"gen{generation}")
        make_folder(beat_dir, "this generation's heartbeat files")
        last, self._hangs = self._hangs, None
        if last is not None:  # its workers are gone: its files are closed here
            last.close()
        # and the folder of the generation before it goes: one a generation stayed to the
        # job's end (a worker kept by a repair in place maps its old file by inode, not by
        # name). Not the last one's yet: this generation's files must find room of their
        # own, so a full runtime folder at a restart stays one clear error, not two freed
        # pages and then every worker's snapshot failing (test_audit_faults).
        if self._old_beats is not None and self._old_beats != beat_dir:
            shutil.rmtree(self._old_beats, ignore_errors=True)
        self._old_beats = last.beat_dir if last is not None and last.beat_dir != beat_dir else None
        faults = self.spec.faults
        self._hangs = HangWatch(
            faults.hang_timeout, beat_dir, self._clock, faults.first_heartbeat_timeout
        )
        return self._hangs

    def _worker_store(
        self, rdzv: JobRendezvous, generation: int, node_rank: int, watch: Callable[[], bool]
    ) -> tuple[str, int]:
        """This generation's store for the workers (torchrun's MASTER_ADDR:MASTER_PORT):
        node 0 hosts a fresh one and publishes it; the others wait for it."""
        self._worker_store_handle = None  # the previous generation's store closes here
        if node_rank != 0:
            return rdzv.workers.wait(generation, self.spec.rdzv.join_timeout, watch)
        opened = host_store(self.addr, 0, self.spec.rdzv.read_timeout)
        self._worker_store_handle = opened.store
        rdzv.workers.publish(generation, self.addr, opened.port)
        return self.addr, opened.port
