"""LocalSlots: this node's workers' slots as the agent keeps them, for one run.

It owns the shard store on /dev/shm (shard_store.py) with its --snapshot-memory budget
split into the workers' slots each generation, what this node's own workers reached
(the newest step each committed, the ceiling the shard server judges replicas by),
the spare slots a restore receives into (spare_pool.py, sized from the largest slot
once a generation's first commit is in) and the memory line the log gets.
"""

from __future__ import annotations

import logging
import os

from ...core.contract.environment import SNAPSHOT_BUDGET, SNAPSHOT_DIR
from ...core.snapshots.admission import StepCeiling
from ...core.snapshots.format import SLOTS_PER_RANK
from ...core.snapshots.restore_plan import Reached, Written
from .shard_store import KEEP_STEPS, ShardStore
from .spare_pool import SpareFiller

logger = logging.getLogger(__name__)

SPARE_SLACK = 16  # a spare holds the largest local shard and this fraction more
SPARE_ROUND = 1 << 20


class LocalSlots:
    def __init__(self, root: str, budget: int | None = None) -> None:
        """budget: the bytes the shards may take; None: half the shared memory under
        root."""
        self.budget = budget or default_budget(root)
        self.store = ShardStore(root, self.budget)
        self.ceiling = StepCeiling()  # the newest step this node's workers committed
        self.generation: int | None = None  # the generation the workers now run
        self.ranks: list[int] = []  # this generation's local ranks
        self._steps: dict[int, int] = {}  # this generation's ranks: newest committed
        self._per_slot = 0  # bytes each snapshot slot may take this generation
        self._snapshotted = False  # a worker of this run committed a snapshot
        self._spares = SpareFiller(self.store.pool, self._spare_sizing)
        self._spares_for: int | None = None  # the generation the spares were sized in

    def committed(self, rank: int, step: int) -> None:
        """A worker of this node committed `step` (from the replicator's thread)."""
        self.ceiling.observe(step)
        self._steps[rank] = max(step, self._steps.get(rank, step))
        if self._spares_for != self.generation:  # its shards' size is known now
            self._spares_for = self.generation
            self._spares.ask()
        if not self._snapshotted:
            self._snapshotted = True
            self.say_memory()

    def committed_slots(self) -> list[tuple[int, int]]:
        """(rank, step) of every slot the current generation's workers committed: the
        steps the replicator had not seen yet are counted from these at its end (it
        polls, and is paused then). A worker that dies right after a commit leaves a
        step every rank has; missing it would put the job's ceiling one step low and
        make every rank restore the step before."""
        if self.generation is None:
            return []
        slots = self.store.local_slots()
        return [
            (shard.rank, shard.step) for shard, _ in slots if shard.generation == self.generation
        ]

    def reached(self) -> Reached:
        """How far this node's own workers got, for the next restore plan."""
        every = bool(self.ranks) and all(r in self._steps for r in self.ranks)
        return Reached(self.ceiling.newest, every)

    def restored(self, step: int | None, ranks: list[int]) -> None:
        """This generation's workers, on `ranks`, resume after `step`: counted as their
        own (only now: a generation that ended in its restore leaves its steps to the
        next)."""
        self._steps = {}
        self.ranks = ranks
        if step is not None:
            self.ceiling.observe(step)
            self._steps = dict.fromkeys(ranks, step)

    def share(
        self, local_world_size: int, copies: int, step: int | None, keep: Written | None
    ) -> dict[str, str]:
        """Ready the slots for this generation's workers, resuming after `step`: old
        slots recycled, shards no restore can want pruned (keep: the save the workers
        were restored to); the environment that points the workers at their slots and
        their share of the budget."""
        assert self.generation is not None
        self.store.recycle(self.generation, self.ranks, step)
        self.store.prune(keep_from=self.generation - 1, keep=keep)
        # each rank's own slots, and the newest KEEP_STEPS replicas of each of copies-1 peers
        shares = SLOTS_PER_RANK + KEEP_STEPS * (copies - 1)
        self._per_slot = per_slot = self.budget // max(local_world_size * shares, 1)
        # Shards held, not bytes used: the interval file the workers are handed sits in
        # their slot folder from the start, snapshots or not.
        if self._snapshotted or self.store.local_slots() or self.store.replicas():
            self.say_memory()
        return {
            SNAPSHOT_DIR: self.store.snap_dir(self.generation),
            SNAPSHOT_BUDGET: str(per_slot),
        }

    def say_memory(self) -> None:
        """The memory line, for a job that snapshots: at its first commit, then at each
        generation start (a job that never calls snapshot() never sees it)."""
        logger.info(
            "snapshot memory: %.1f MiB in use, budget %.1f MiB (%.1f MiB per snapshot slot)",
            self.store.used_bytes() / 2**20,
            self.budget / 2**20,
            self._per_slot / 2**20,
        )

    def _spare_sizing(self) -> tuple[int, int, int]:
        """The spare slots restores receive into: one per local rank, as large as the
        largest shard they committed and a sixteenth more, within what the budget
        leaves free. The slack: a resharding load fetches other ranks' shards, whose
        sizes differ by a few rows (FSDP2 over 3 ranks: another rank's 200.7 MiB shard
        did not fit this one's spare: fresh memory, 2.0 s against 0.8 s)."""
        largest = self.store.largest_slot(self.generation)
        size = -(-(largest + largest // SPARE_SLACK) // SPARE_ROUND) * SPARE_ROUND
        return len(self.ranks), size, max(self.budget - self.store.used_bytes(), 0)

    def close(self) -> None:
        self._spares.close()


def default_budget(root: str) -> int:
    """Half of the shared-memory file system the shards live on."""
    stats = os.statvfs(root)
    return stats.f_frsize * stats.f_blocks // 2
