"""Disk checkpoints: the last resort when no copy of some shard survives in memory.

With --checkpoint-dir and --checkpoint-every N, the replicator hands every N-th step's
shard to a DiskCheckpointer, which copies it (one memory copy) and writes it from its
own thread, so training never waits for the disk. The layout, shared by all nodes
(a shared file system, like torch.distributed.checkpoint's):

  <dir>/step-<S>/rank-<R>.shard    the shard, written to a temporary name and renamed
  <dir>/step-<S>/rank-<R>.json     {"world_size": W, "crcs": [...]} once the shard is in

A step is complete when every rank 0..W-1 has both files. Restore reads the newest
complete step, verifies each shard's checksums, and says it came from disk.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import queue
import re
import threading
from typing import Any

from .checksums import verify

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"step-(\d+)$")


class DiskCheckpointer:
    def __init__(self, directory: str, every: int) -> None:
        self.directory = directory
        self.every = every
        self._queue: queue.Queue[tuple[int, int, int, bytes, list[int]] | None] = queue.Queue()
        self._pending: set[int] = set()  # ranks with a write queued or in progress
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rtrain-checkpoint", daemon=True)
        self._thread.start()

    def offer(self, rank: int, step: int, world_size: int, buffer: bytes, crcs: list[int]) -> None:
        """Queue this shard if its step is due; while the rank's previous checkpoint is
        still being written, this one is skipped (training never waits for the disk)."""
        if self.every <= 0 or step % self.every:
            return
        with self._lock:
            if rank in self._pending:
                logger.warning(
                    "disk checkpoint of rank %d step %d skipped: the previous one is writing",
                    rank,
                    step,
                )
                return
            self._pending.add(rank)
        self._queue.put((rank, step, world_size, bytes(buffer), crcs))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            rank, step, world_size, data, crcs = item
            try:
                write_checkpoint(self.directory, rank, step, world_size, data, crcs)
            except OSError as exc:
                logger.error("disk checkpoint of step %d failed: %s", step, exc)
            finally:
                with self._lock:
                    self._pending.discard(rank)


def write_checkpoint(
    directory: str, rank: int, step: int, world_size: int, data: Any, crcs: list[int]
) -> None:
    """One rank's shard of `step`; the .json, written last, says it is whole."""
    folder = os.path.join(directory, f"step-{step:09d}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank-{rank}.shard")
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)
    with open(os.path.join(folder, f"rank-{rank}.json"), "w") as handle:
        json.dump({"world_size": world_size, "crcs": crcs}, handle)


def newest_complete(directory: str) -> tuple[int, int] | None:
    """(step, world size) of the newest checkpoint every rank finished, or None."""
    steps = []
    for folder in glob.glob(os.path.join(directory, "step-*")):
        match = STEP_DIR.search(folder)
        if match:
            steps.append((int(match[1]), folder))
    for step, folder in sorted(steps, reverse=True):
        try:
            with open(os.path.join(folder, "rank-0.json")) as handle:
                world = int(json.load(handle)["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(
            os.path.exists(os.path.join(folder, f"rank-{r}.{ext}"))
            for r in range(world)
            for ext in ("shard", "json")
        ):
            return step, world
    return None


def load_verified(directory: str, step: int, rank: int) -> bytes:
    """The shard of `rank` at `step`, checksum verified (OSError/ValueError if not)."""
    folder = os.path.join(directory, f"step-{step:09d}")
    with open(os.path.join(folder, f"rank-{rank}.json")) as handle:
        crcs = [int(c) for c in json.load(handle)["crcs"]]
    with open(os.path.join(folder, f"rank-{rank}.shard"), "rb") as handle:
        data = handle.read()
    if not verify(data, len(data), crcs):
        raise ValueError(f"disk checkpoint {folder}/rank-{rank}.shard failed its checksum")
    return data
