"""The disk side of a run: DiskCheckpoints owns --checkpoint-dir (its signed manifests:
checkpoints.py), the DiskCheckpointer the replicator hands every N-th step, and the save
of this node's workers' snapshots at once (save_slots: a Slurm job about to be stopped,
every committed slot of the generation, as its header says it is)."""

from __future__ import annotations

import logging

from ....core.config.specs import SnapshotSpec
from ....core.snapshots.format import HEADER_SIZE
from ...observe.progress import WaitProgress
from ..checksums import checksums
from ..shard_store import ShardStore
from ..slot_check import fitting_header
from .checkpoints import CheckpointDir, DiskCheckpointer, open_checkpoint_dir, write_checkpoint

logger = logging.getLogger(__name__)


def save_slots(
    store: ShardStore, directory: CheckpointDir, generation: int, world_size: int
) -> int | None:
    """Write every committed slot of `generation` to `directory`; the newest step
    written, or None. Every slot of every rank goes, so the ranks of all nodes share a
    complete step. Call with the workers stopped: a slot being rewritten must not be
    copied."""
    steps = []
    slots = [(s, p) for s, p in store.local_slots() if s.generation == generation]
    written = 0
    with WaitProgress("saving snapshots to --checkpoint-dir", log=logger) as progress:
        for shard, path in slots:
            with open(path, "rb") as handle:
                data = handle.read()
            header = fitting_header(data[:HEADER_SIZE], len(data), path)
            if header is None or header.step != shard.step:
                continue
            data = data[: header.size]
            write_checkpoint(
                directory, shard.rank, shard.step, world_size, data, checksums(data, len(data))
            )
            steps.append(shard.step)
            written += len(data)
            progress.update(
                f"{len(steps)} of {len(slots)} shards, {written / 2**20:.0f} MiB",
                len(steps),
                len(slots),
            )
    return max(steps, default=None)


class DiskCheckpoints:
    """--checkpoint-dir for one run, when given: read by the restore of last resort,
    written by the checkpointer (with --checkpoint-every) and by save()."""

    def __init__(self, settings: SnapshotSpec, secret: bytes | None) -> None:
        """secret: the job secret given, or None."""
        # Signed with the secret given, else with the folder's own key: a secret handed
        # out through the store dies with it, and a requeued job must read its checkpoints.
        folder = settings.checkpoint_dir
        self.directory = open_checkpoint_dir(folder, secret) if folder else None
        self.checkpointer = (
            DiskCheckpointer(self.directory, settings.checkpoint_every, settings.keep_checkpoints)
            if self.directory and settings.checkpoint_every
            else None
        )

    def save(self, store: ShardStore, generation: int | None, world_size: int) -> int | None:
        """Write the workers' snapshots of `generation` to the folder now; the newest
        step written, or None (no folder, no generation yet). Call with the workers
        stopped."""
        if not self.directory or generation is None:
            return None
        return save_slots(store, self.directory, generation, world_size)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
