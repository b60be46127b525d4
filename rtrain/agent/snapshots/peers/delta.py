"""A replica sent against a base: only the chunks the receiving node does not hold.

Data-parallel replicas of a stage hold the same parameters and optimizer state (DDP,
the replicated dimension of HSDP), so when a node replicates rank r's shard to a ring
successor where r's DP twin (core/snapshots/redundancy.py) runs, that node already has
almost every byte: in its own worker's slot of the same step. The put then names that
slot as its base:

  client: put {gen, rank, step, size, crcs, base: [gen, rank, step]} + the 64-byte header
  server: {need: [chunk indices]}         the chunks whose digests the base lacks
  client: those chunks, in order
  server: {ok}                            the replica assembled and verified whole

The topology proposes the base and the per-chunk digests decide (chunk_bounds lines
the data chunks up across skeletons of other lengths): where the twin's bytes differ
(FSDP shards, per-rank RNG, a data position) those chunks travel, so the rule is never
wrong, only sometimes no cheaper. The replica is whole in the receiver's memory either
way: losing the twin later loses nothing. The base is the receiver's own slot, which
its worker may rewrite at any moment: the assembled replica is verified against the
sender's digests before it is kept, and a mismatch is refused (the sender retries).
"""

from __future__ import annotations

import socket
from typing import Any

from ....core.clock import Clock
from ....core.snapshots.format import HEADER_SIZE, chunk_bounds
from ....core.snapshots.restore_plan import ShardId
from ...waiting import SYSTEM_CLOCK
from ..checksums import checksums
from ..shard_store import ShardStore

BASE_WAIT_S = 0.25  # a DP twin commits the same step within milliseconds of its peer
BASE_POLL_S = 0.005


def needed_chunks(
    head: bytes, size: int, crcs: list[int], base: tuple[Any, int, list[int]] | None
) -> list[int]:
    """The indices of the chunks of a (head, size, crcs) shard that `base` (buffer,
    size, crcs) does not hold byte for byte."""
    bounds = chunk_bounds(head, size)
    if base is None or len(bounds) != len(crcs):
        return list(range(len(bounds)))
    buffer, base_size, base_crcs = base
    theirs = chunk_bounds(bytes(buffer[:HEADER_SIZE]), base_size)
    need = []
    for i, (start, end) in enumerate(bounds):
        same = (
            i < len(theirs)
            and i < len(base_crcs)
            and theirs[i][1] - theirs[i][0] == end - start
            and base_crcs[i] == crcs[i]
        )
        if not same:
            need.append(i)
    return need


def find_base(
    store: ShardStore, base: ShardId, clock: Clock = SYSTEM_CLOCK
) -> tuple[Any, int, list[int]] | None:
    """The base shard, waiting a moment for a twin that is still writing that step."""
    deadline = clock.now() + BASE_WAIT_S
    while True:
        found = store.open_shard(base)
        if found is not None or clock.now() >= deadline:
            return found
        clock.sleep(BASE_POLL_S)


def assemble(
    sock: socket.socket,
    target: Any,
    head: bytes,
    size: int,
    need: list[int],
    base: tuple[Any, int, list[int]] | None,
    receive: Any,
) -> list[int]:
    """Build the replica in `target`: the header, the needed chunks from the socket
    (receive(sock, view, start, end)), the rest from the base; its digests."""
    view = memoryview(target)
    view[:HEADER_SIZE] = head
    bounds = chunk_bounds(head, size)
    wanted = set(need)
    if base is not None:
        buffer, base_size, _ = base
        theirs = chunk_bounds(bytes(buffer[:HEADER_SIZE]), base_size)
        source = memoryview(buffer)
    for i, (start, end) in enumerate(bounds):
        if i in wanted:
            receive(sock, view, start, end)
        else:
            their_start = theirs[i][0]
            view[start:end] = source[their_start : their_start + end - start]
    return checksums(target, size)
