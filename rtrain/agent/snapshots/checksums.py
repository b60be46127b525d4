"""The chunk checksums of a shard, computed on a thread pool (xxhash releases the GIL).

The digest of a chunk is core's (core/snapshots/format.chunk_digest); the threads
live here, in the agent, because core starts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...core.snapshots.format import HEADER_SIZE, chunk_bounds, chunk_digest

_pool: tuple[int, ThreadPoolExecutor] | None = None


def _hash_pool() -> ThreadPoolExecutor:
    """One pool per process, kept: starting threads costs more than hashing 10 MB.
    Keyed by pid, because a forked child inherits the pool but not its threads."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(min(os.cpu_count() or 1, 8), "rtrain-hash"))
    return _pool[1]


def checksums(buffer: Any, size: int) -> list[int]:
    """The digest of each chunk of buffer[:size] (core's chunk_bounds), in parallel."""
    view = memoryview(buffer)
    bounds = chunk_bounds(view[:HEADER_SIZE], size)
    if len(bounds) <= 1:
        return [chunk_digest(view[a:b]) for a, b in bounds]
    return list(_hash_pool().map(lambda ab: chunk_digest(view[ab[0] : ab[1]]), bounds))


def verify(buffer: Any, size: int, expected: Sequence[int]) -> bool:
    return checksums(buffer, size) == list(expected)
