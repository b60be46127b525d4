"""RestoreSide: the restore side of a run, at each generation start and after it.

It owns each generation's agreed restore (restorer.py: local memory, the peers, the
disk checkpoint of last resort), where the save the workers were last restored to was
written (kept for a resharding load after a second failure), the step they resume
after, and the PeerFetcher that brings other ranks' shards to the workers' resharding
loads (fetcher.py, prefetch.py). It starts on the job's store and the transport
(start); a store carried over to a new one starts it again.
"""

from __future__ import annotations

import logging

from ....core.clock import Clock
from ....core.snapshots.restore_plan import Reached, Written, written_in
from ...observe.events import emit
from ...rendezvous.job import JobRendezvous
from ...waiting import SYSTEM_CLOCK
from ..disk.checkpoints import CheckpointDir
from ..peers.transport import Address, ShardTransport
from ..shard_store import ShardStore
from .copies import RestoreResult
from .fetcher import PeerFetcher
from .restorer import Pooled, Restorer, RestoreRound
from .shard_fetch import FetchContext, holders_of

logger = logging.getLogger(__name__)


class RestoreSide:
    def __init__(
        self,
        store: ShardStore,
        checkpoint_dir: CheckpointDir | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """checkpoint_dir: the disk checkpoint of last resort; clock: the restore's."""
        self._store = store
        self._checkpoint_dir = checkpoint_dir
        self._clock = clock
        self._fetcher = PeerFetcher(store, clock)
        self._restorer: Restorer | None = None
        self._transport: ShardTransport | None = None
        self._loaded: Written | None = None  # where the save last restored was written
        self.restored_step: int | None = None  # the step this generation's workers resume after

    def start(self, rdzv: JobRendezvous, transport: ShardTransport) -> None:
        """Restore through the job's store `rdzv` and fetch through `transport`."""
        self._restorer = Restorer(rdzv, self._store, transport, self._checkpoint_dir, self._clock)
        self._transport = transport

    def pause(self) -> None:
        """No fetches for the last generation's workers."""
        self._fetcher.follow(None)

    def restore(
        self, round_: RestoreRound, server: Address, reached: Reached
    ) -> tuple[Pooled, RestoreResult]:
        """This node's part in the generation's agreed restore (Restorer.restore), said
        in the log and as a `restore` event."""
        if self._restorer is None:
            raise RuntimeError("RestoreSide.start() comes before a restore")
        pooled, result = self._restorer.restore(round_, server, reached, self._loaded)
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
        self._loaded = self._written(round_.generation, result, pooled)
        return pooled, result

    @property
    def loaded(self) -> Written | None:
        """Where the save this generation's workers were restored to was written (None:
        restored from disk, or nothing)."""
        return self._loaded

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

    def follow(self, round_: RestoreRound, pooled: Pooled, local_ranks: list[int]) -> None:
        """Point the fetcher at this generation's holders of each shard, and prefetch
        the shards its resharding load will read, before it runs."""
        assert self._transport is not None
        self._fetcher.follow(
            FetchContext(
                round_.generation,
                round_.node_rank,
                local_ranks,
                holders_of(pooled.inventory),
                pooled.servers,
                self._transport,
                self._loaded,
                world_size=round_.topology.world_size,
            )
        )
        self._fetcher.prefetch()

    def committed(self, step: int) -> None:
        """A local worker committed `step`: the prefetched shards of an older one go."""
        self._fetcher.committed(step)

    def serve_requests(self) -> None:
        """Serve any request for peers' shards a local worker has put down."""
        self._fetcher.poll()
