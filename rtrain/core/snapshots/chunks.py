"""A shard's checksummed chunks: the byte ranges its checksums cover (the skeleton,
then the data area in CHUNK pieces) and the digest of each, whole or streamed as it
arrives. Re-exported by core/snapshots/format.py, the shard's format."""

from __future__ import annotations

from typing import Any

import xxhash

from .header import HEADER_SIZE, read_header

CHUNK = 8 << 20


def chunk_bounds(head: Any, size: int) -> list[tuple[int, int]]:
    """The [start, end) byte ranges the checksums of a `size`-byte shard cover, given
    its first HEADER_SIZE bytes: the skeleton, then the data area in CHUNK pieces from
    its start. Bytes that are not a shard's header are cut in CHUNK pieces from the end
    of the header (they are hashed, and refused, all the same)."""
    header = read_header(head) if len(head) >= HEADER_SIZE else None
    if header is None or header.size > size:
        starts = range(HEADER_SIZE, max(size, HEADER_SIZE + 1), CHUNK)
        return [(start, min(start + CHUNK, size)) for start in starts]
    data = HEADER_SIZE + header.meta_len
    bounds = [(HEADER_SIZE, data)]
    bounds += [(start, min(start + CHUNK, size)) for start in range(data, size, CHUNK)]
    return bounds


def chunk_digest(data: Any) -> int:
    """The checksum of one CHUNK of a shard (agent/snapshots/checksums.py hashes the
    chunks of a shard in parallel: xxhash releases the GIL)."""
    return xxhash.xxh3_64_intdigest(data)


def chunk_hasher() -> Any:
    """A streaming form of chunk_digest (update(piece)..., intdigest()), for a chunk
    checked as it arrives piece by piece."""
    return xxhash.xxh3_64()
