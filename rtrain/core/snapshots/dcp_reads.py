"""Which writers' shards a resharding load will read, predicted from the save's index
and the new world: the agents fetch them before the workers start
(agent/snapshots/peers/prefetch.py), so the load reads local memory.

A prediction only. DCP's planner decides what each rank reads; a shard it reads that
was not predicted is fetched on demand (core/worker/peer_shards.py), and one predicted
but not read costs a transfer: a wrong guess costs time, never a wrong state.

The guess is FSDP's (and DDP's): a tensor saved in chunks along dim 0 is read again in
torch.chunk's pieces of dim 0 over the new world (rank r of W: rows [r*c, (r+1)*c),
c = ceil(rows / W)); a tensor saved whole and a plain value (replicated ones, which DCP
kept on one writer) are read whole by every rank. Pure: no I/O.
"""

from __future__ import annotations

from ..contract.dcp_index import Item, SaveIndex


def rows_of(rank: int, world: int, rows: int) -> tuple[int, int]:
    """[start, end) of dim 0 that rank `rank` of `world` holds, as torch.chunk cuts it."""
    piece = -(-rows // world) if world > 0 else rows
    start = min(rank * piece, rows)
    return start, min(start + piece, rows)


def read_by(item: Item, rank: int, world: int) -> bool:
    """Whether rank `rank` of `world` is expected to read this item's chunk."""
    size, offsets, sizes = item.size, item.chunk_offsets, item.chunk_sizes
    if item.kind == "b" or not size or offsets is None or sizes is None or sizes == size:
        return True  # a value, a 0-d tensor, or a whole tensor: read whole by everyone
    start, end = rows_of(rank, world, size[0])
    return offsets[0] < end and start < offsets[0] + sizes[0]


def writers_read(index: SaveIndex, rank: int, world: int) -> set[int]:
    """The writers whose shards rank `rank` of the new `world` is expected to read."""
    found: set[int] = set()
    for item in index.items:
        if item.writer not in found and read_by(item, rank, world):
            found.add(item.writer)
    return found
