"""A small /dev/shm, said at start: a container's default is 64 MiB.

The snapshot budget defaults to half of the memory file system the shards live on
(agent/snapshots/service.py), shared by each local worker's slots and the replicas it
keeps for peers. On a container's default /dev/shm that is 32 MiB, a few MiB a
snapshot slot: the first snapshot of any real model fails. rtrain says so at start,
with the fix (a memory-backed emptyDir at /dev/shm on Kubernetes, --shm-size on
Docker, or --snapshot-memory), instead of leaving it to the first snapshot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from ...core.snapshots.format import SLOTS_PER_RANK
from ..runtime_dir import runtime_base
from ..snapshots.shard_store import KEEP_STEPS

logger = logging.getLogger(__name__)

MiB = 2**20
# A snapshot slot smaller than this holds no real model's shard: the budget is too small
# for what one snapshot needs (a 64 MiB /dev/shm gives 6.4 MiB to one worker).
SMALL_SLOT_BYTES = 64 * MiB
FIX = (
    "give the container a bigger /dev/shm: on Kubernetes a memory-backed emptyDir "
    "mounted at /dev/shm (emptyDir: {medium: Memory, sizeLimit: 16Gi}), on Docker "
    "--shm-size; or set --snapshot-memory"
)


def slot_budget(budget: int, nproc: int, copies: int) -> int:
    """Bytes each snapshot slot gets: the agent's split (SnapshotService.prepare)."""
    shares = SLOTS_PER_RANK + KEEP_STEPS * (copies - 1)
    return budget // max(nproc * shares, 1)


def shm_warning(
    folder: str, fs_bytes: int, given: int | None, nproc: int, copies: int
) -> str | None:
    """The warning for a snapshot budget below what one snapshot needs, or None.
    given: --snapshot-memory (None: half of the file system)."""
    if given is not None:
        if given <= fs_bytes:
            return None  # the user sized it
        return (
            f"--snapshot-memory {given / MiB:.1f} MiB is more than {folder} holds "
            f"({fs_bytes / MiB:.1f} MiB): snapshots fail once it is full; {FIX}"
        )
    budget = fs_bytes // 2
    per_slot = slot_budget(budget, nproc, copies)
    if per_slot >= SMALL_SLOT_BYTES:
        return None
    return (
        f"{folder} is {fs_bytes / MiB:.1f} MiB, so the snapshot budget is "
        f"{budget / MiB:.1f} MiB: {per_slot / MiB:.1f} MiB a snapshot slot for {nproc} "
        f"worker(s) with {copies} copies, and a bigger snapshot fails; {FIX}"
    )


def check_shm(
    memory: int | None,
    nproc: int,
    copies: int,
    environ: Mapping[str, str] | None = None,
    statvfs: Callable[[str], Any] = os.statvfs,
) -> str | None:
    """Log (and return) the warning for the folder snapshots will live in."""
    folder = runtime_base(dict(environ) if environ is not None else None)
    try:
        stats = statvfs(folder)
    except OSError:
        return None
    message = shm_warning(folder, stats.f_frsize * stats.f_blocks, memory, nproc, copies)
    if message is not None:
        logger.warning("%s", message)
    return message
