"""SnapshotService: the agent's side of in-memory snapshots, for one run.

It ties four parts that each own their state: this node's slots and their budget
(local_slots.py), replication to the ring successors (replication/), each generation's
restore and the peers' shards its workers' loads read (restore/), and --checkpoint-dir
(disk/). Shards move between agents through one transport (peers/transport.py), from
this node's endpoint (peers/endpoint.py). Its life: start() once the job's store is
open (again if the store carried over to a new one), prepare() at each generation
start, close() at the end.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence

from ...core.clock import Clock
from ...core.config.component_specs import SnapshotPart
from ..net.probe import NetProbe
from ..rendezvous.job import JobRendezvous
from ..waiting import SYSTEM_CLOCK
from .disk.save import DiskCheckpoints
from .local_slots import LocalSlots
from .peers.endpoint import ShardEndpoint
from .replication.ring import Replication
from .restore.restorer import RestoreRound
from .restore.side import RestoreSide


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
        None to hand a random one out through the store; clock: the restore's and the
        replication's."""
        self._clock = clock
        self._settings = settings = part.snapshots
        self._host = host
        self._secret = secret
        self.local = LocalSlots(root, settings.memory)
        self.store = self.local.store
        self.disk = DiskCheckpoints(settings, secret)
        self.restores = RestoreSide(self.store, self.disk.directory, clock)
        self._rdzv: JobRendezvous | None = None  # the job's store, as start() was given it
        self._endpoint: ShardEndpoint | None = None  # these two from start() on
        self._replication: Replication | None = None
        self._probe: NetProbe | None = None
        self._world_size = 0

    @classmethod
    def for_launch(
        cls,
        part: SnapshotPart,
        runtime_dir: str,
        addr: str,
        secret: bytes | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> SnapshotService:
        """The service a launch asks for, its shards in <runtime_dir>/shards."""
        root = os.path.join(runtime_dir, "shards")
        os.makedirs(root)
        return cls(root, addr if addr != "localhost" else "127.0.0.1", part, secret, clock)

    def start(self, rdzv: JobRendezvous) -> None:
        """Start on the job's store: the job secret as given (job_secret.py), else one
        random value the first agent sets in the store; the shard server and the
        replicating thread. Called again with a new store (the job's store carried over
        to a new one: agent/kube/store_return.py), it restores through that one."""
        if self._endpoint is not None and self._replication is not None:
            if rdzv is not self._rdzv and self._secret is not None:
                self._rdzv = rdzv
                self._replication.use_store(rdzv.store)
                self.restores.start(rdzv, self._endpoint.transport)
            return
        if self._secret is None:
            self._secret = rdzv.store.set_once(rdzv.keys.secret, secrets.token_hex(32))
        self._rdzv = rdzv
        self._endpoint = ShardEndpoint(self._host, self._secret, self.store, self.local.ceiling)
        self._probe = NetProbe(
            self._host, self._settings.net_probe or 0, rdzv.store, rdzv.keys.net_probe
        )
        self.restores.start(rdzv, self._endpoint.transport)
        self._replication = Replication(
            self.store,
            self._endpoint.transport,
            rdzv,
            self._settings.copies,
            self._settings.dp_delta,
            self,
            self.disk.checkpointer,
            self._clock,
        )

    def prepare(self, round_: RestoreRound, local_world_size: int) -> dict[str, str]:
        """Restore this node's new workers in `round_`; the environment that points
        them at their slots."""
        endpoint, replication = self._endpoint, self._replication
        if endpoint is None or replication is None:
            raise RuntimeError("SnapshotService.start() comes before prepare()")
        # The last generation ends here: replication paused, its last commits counted,
        # no fetches for its workers; the new one's members served.
        replication.pause()
        for rank, step in self.local.committed_slots():
            self.committed(rank, step)
        self.restores.pause()
        self.local.generation, self._world_size = round_.generation, round_.topology.world_size
        endpoint.admit(round_.membership, round_.node_rank, self._settings.copies)
        if self._probe is not None:  # once, off the workers' path (agent/net/probe.py)
            self._probe.after_admit(round_.membership.members, round_.node_rank)
        reached = self.local.reached()
        pooled, result = self.restores.restore(round_, endpoint.address, reached)
        mine = [c.rank for c in round_.topology.coords if c.node_rank == round_.node_rank]
        self.local.restored(result.step, mine)
        self.restores.follow(round_, pooled, mine)
        replication.follow(
            round_.generation,
            round_.node_rank,
            len(round_.membership.members),
            round_.topology,
            pooled.servers,
            mine,
            local_world_size,
        )
        return self.local.share(
            local_world_size, self._settings.copies, result.step, self.restores.loaded
        )

    # The replicator's CommitListener (replication/replicator.py), on its thread.

    def committed(self, rank: int, step: int) -> None:
        self.local.committed(rank, step)
        self.restores.committed(step)  # a newer step: the prefetched shards were read

    def between_passes(self) -> None:
        self.restores.serve_requests()

    # What the rest of the agent asks.

    @property
    def restored_step(self) -> int | None:
        """The step this generation's workers resume after."""
        return self.restores.restored_step

    def progress(self) -> tuple[int | None, int | None]:
        """(the newest step this node's workers committed, the newest replicated)."""
        replicated = self._replication.newest_replicated if self._replication else None
        return self.local.ceiling.newest, replicated

    def agree_interval(self, steps: Sequence[int] = ()) -> None:
        """The adapt policy's job-wide snapshot interval (replication/interval.py):
        called at the generation monitor's store checks, with the steps of this node's
        workers' latest heartbeats."""
        if self._replication is not None:
            self._replication.agree_interval(steps)

    def save_to_disk(self) -> int | None:
        """Write this node's workers' snapshots to --checkpoint-dir now (a Slurm job about
        to be stopped); the newest step written, or None (disk/save.py). Call with the
        workers stopped."""
        return self.disk.save(self.store, self.local.generation, self._world_size)

    @property
    def secret(self) -> bytes | None:
        """The job secret (None until start(), if none was given)."""
        return self._secret

    def close(self) -> None:
        self.local.close()
        if self._replication is not None:
            self._replication.close()
        if self._endpoint is not None:
            self._endpoint.close()
        if self._probe is not None:
            self._probe.close()
        self.disk.close()
