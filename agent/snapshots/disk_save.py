"""Saving this node's workers' snapshots to --checkpoint-dir at once (a Slurm job about
to be stopped): every committed slot of the generation, as its header says it is."""

from __future__ import annotations

import logging

from ...core.snapshots.format import HEADER_SIZE
from ..observe.progress import WaitProgress
from .checksums import checksums
from .disk_checkpoints import CheckpointDir, write_checkpoint
from .shard_store import ShardStore
from .slot_check import fitting_header

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
