"""The 64-byte header of a shard (core/snapshots/format.py has the whole layout).

  magic (8) | version (4) | state (4) | step | meta_len | data_len | replicated |
  interval | replicate_us          (8 bytes each, little-endian)

The first seven fields are checked before any size is used (header_misfit); the last
two are hints nothing trusts: the snapshot interval the worker kept when it wrote the
shard, and how long the agent took to checksum and replicate it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"RTRSHRD1"
HEADER = struct.Struct("<8sIIqqqq")  # magic, version, state, step, meta_len, data_len, replicated
HEADER_SIZE = 64
VERSION = 3  # 2: XXH3-64 chunk digests instead of CRC-32; 3: a JSON skeleton, no pickle
EMPTY, WRITING, COMMITTED = 0, 1, 2
STATE_OFFSET = 12  # where the 4-byte state field sits, for the final commit write
REPLICATED_OFFSET = 40  # the step the agent last replicated (written by the agent)
# Past the checked header, read by no check: the snapshot interval the worker wants
# (core/worker/cadence.py; its low 32 bits) and the gap between its snapshot() calls'
# steps (the high 32 bits: step // gap is the step index, core/snapshots/interval.py),
# and the microseconds the agent took to checksum and replicate it (written with the
# replicated mark). Zero: not known.
INTERVAL_OFFSET = 48
REPLICATE_US_OFFSET = 56


@dataclass(frozen=True)
class ShardHeader:
    state: int
    step: int
    meta_len: int
    data_len: int
    replicated: int

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.meta_len + self.data_len


def read_header(buffer: Any) -> ShardHeader | None:
    """The shard's header, or None if the buffer does not hold one."""
    if len(buffer) < HEADER_SIZE:
        return None
    magic, version, state, step, meta_len, data_len, replicated = HEADER.unpack_from(buffer, 0)
    if magic != MAGIC or version != VERSION or meta_len < 0 or data_len < 0:
        return None
    return ShardHeader(state, step, meta_len, data_len, replicated)


def header_misfit(header: ShardHeader, length: int) -> str | None:
    """Why `header` cannot be that of a shard held in `length` bytes (its slot file's,
    its mapping's, a replica's listed size), or None when it fits.

    Every size a header gives is checked here before it is used: a header is not
    covered by the checksums, so one with a data length of 2**50 would otherwise be
    hashed, sent, allocated and restored as if its slot held that much."""
    if header.size > length:
        return (
            f"its header claims {header.meta_len} + {header.data_len} bytes past the "
            f"header, but only {max(length - HEADER_SIZE, 0)} hold them"
        )
    return None


def write_header(buffer: Any, header: ShardHeader) -> None:
    HEADER.pack_into(
        buffer,
        0,
        MAGIC,
        VERSION,
        header.state,
        header.step,
        header.meta_len,
        header.data_len,
        header.replicated,
    )


def set_replicated(buffer: Any, step: int) -> None:
    struct.pack_into("<q", buffer, REPLICATED_OFFSET, step)


def replicated_step(buffer: Any) -> int:
    return struct.unpack_from("<q", buffer, REPLICATED_OFFSET)[0]


def shard_interval(buffer: Any) -> int:
    """The snapshot interval the worker wrote with the shard (0: not known)."""
    return struct.unpack_from("<q", buffer, INTERVAL_OFFSET)[0] & 0xFFFFFFFF


def shard_gap(buffer: Any) -> int:
    """The gap between the worker's snapshot() steps written with the shard (0: not known)."""
    return (struct.unpack_from("<q", buffer, INTERVAL_OFFSET)[0] >> 32) & 0x7FFFFFFF


def interval_field(interval: int, gap: int = 0) -> int:
    """The INTERVAL_OFFSET field: interval in the low 32 bits, gap in the high ones."""
    return (min(max(gap, 0), 0x7FFFFFFF) << 32) | (interval & 0xFFFFFFFF)


def set_replicate_time(buffer: Any, seconds: float) -> None:
    struct.pack_into("<q", buffer, REPLICATE_US_OFFSET, max(int(seconds * 1e6), 1))


def replicate_time(buffer: Any) -> float:
    """The seconds the agent took to checksum and replicate the shard (0.0: not known)."""
    return max(struct.unpack_from("<q", buffer, REPLICATE_US_OFFSET)[0], 0) / 1e6
