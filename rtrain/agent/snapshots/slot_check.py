"""A slot's or a replica's header, checked against what holds it before any size of it
is used; a header that does not fit is a corrupt slot, said once.

A header is not covered by the shard's checksums: its magic, version and committed
flag can be intact while its lengths are garbage (a stray write, bad memory). Trusted,
a data length of 2**36 made the replicator send a 64 GiB "replica", the restore take
that step (checksums computed over the same garbage agree with themselves) and every
worker fail to read it; 2**50 made a chunk list of many GB. So the shard store, the
replicator and the restore read headers through fitting_header: a misfit is no
snapshot at all, and its step is never counted toward what the node reached.
"""

from __future__ import annotations

import logging
import threading

from ...core.snapshots.format import (
    COMMITTED,
    REPLICATED_OFFSET,
    ShardHeader,
    header_misfit,
    read_header,
)
from ..net.limits import RateLimitedLog

logger = logging.getLogger(__name__)

# Corrupt slots already said (where, header bytes): once each, for as long as the
# agent runs; forgotten all at once past this many (a flood costs no memory).
REMEMBERED = 4096

_said: set[tuple[str, bytes]] = set()
_lock = threading.Lock()
_log = RateLimitedLog(logger)


def fitting_header(head: bytes, length: int, where: str) -> ShardHeader | None:
    """The committed header in `head` (the first HEADER_SIZE bytes of a slot or a
    replica) if it fits the `length` bytes that hold its shard. None when there is no
    committed shard (never written, being written, wiped, not a shard: nothing to
    say) and when the header does not fit, which is reported once (corrupt())."""
    header = read_header(head)
    if header is None or header.state != COMMITTED:
        return None
    why = header_misfit(header, length)
    if why is None:
        return header
    corrupt(where, head, f"step {header.step}: {why}")
    return None


def corrupt(where: str, head: bytes, why: str) -> None:
    """Say that `where` holds a corrupt shard, once per header (the replicated mark,
    which the agent rewrites, aside), and at most once a minute for all of them."""
    key = (where, bytes(head[:REPLICATED_OFFSET]))
    with _lock:
        if key in _said:
            return
        if len(_said) >= REMEMBERED:
            _said.clear()
        _said.add(key)
    _log.warn(
        "corrupt",
        "%s holds a corrupt snapshot (%s): it is not used, and its step does not count",
        where,
        why,
    )
