"""ShardTransport: the one way state moves between agents, and its TCP implementation.

In the style of torchft's CheckpointTransport: the replicator sends each committed
shard to its ring successors (send_replica), and a restore or a worker's resharding
load fetches a shard from a node that holds one (fetch_shard); neither knows how the
bytes travel. TcpTransport carries them over the authenticated wire of this package
(client.py to every other agent's server.py, which judges the requests by the address
they come from: this node's job address, `source`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ....core.snapshots.restore_plan import ShardId
from .client import ShardClient
from .wire import ShardError

Address = tuple[str, int]  # a node's shard server: (host, port)


class ShardTransport(Protocol):
    def send_replica(
        self,
        peer: Address,
        shard: ShardId,
        buffer: Any,
        size: int,
        crcs: list[int],
        base: ShardId | None = None,
    ) -> int:
        """Keep a replica of `shard` (the first `size` bytes of buffer, with its chunk
        checksums) on `peer`; with `base` (a shard the peer holds, a DP twin's) only the
        chunks it lacks travel. The bytes of shard data sent; OSError or ShardError if
        the peer did not take it."""
        ...

    def fetch_shard(
        self, peer: Address, shard: ShardId, into: Callable[[int], Any]
    ) -> tuple[int, list[int]]:
        """Receive `shard` from `peer` into the buffer into(size) returns, verified
        against its checksums; (size, crcs). OSError or ShardError if none came whole."""
        ...

    def hang_up(self) -> None:
        """Let go of the connections send_replica keeps (a new generation's peers)."""
        ...


@dataclass
class Peers:
    """How this node reaches the others' shards: the transport, and each node's server."""

    transport: ShardTransport
    servers: dict[int, Address]  # node rank -> its shard server


class TcpTransport:
    """ShardTransport over the authenticated TCP peers. Replicas to a peer reuse one
    connection while it works (one replicating thread sends); each fetch has one of
    its own (restores and loads fetch on several threads at once)."""

    def __init__(self, secret: bytes, source: str | None = None) -> None:
        """source: this node's job address, which the peers' servers judge it by."""
        self._secret = secret
        self._source = source
        self._kept: dict[Address, ShardClient] = {}
        self._lock = threading.Lock()

    def send_replica(
        self,
        peer: Address,
        shard: ShardId,
        buffer: Any,
        size: int,
        crcs: list[int],
        base: ShardId | None = None,
    ) -> int:
        with self._lock:
            client = self._kept.get(peer)
        try:
            if client is None:
                client = ShardClient(peer[0], peer[1], self._secret, self._source)
                with self._lock:
                    self._kept[peer] = client
            return client.put(shard, buffer, size, crcs, base)
        except (OSError, ShardError):
            with self._lock:  # the next replica to this peer connects anew
                self._kept.pop(peer, None)
            raise

    def fetch_shard(
        self, peer: Address, shard: ShardId, into: Callable[[int], Any]
    ) -> tuple[int, list[int]]:
        client = ShardClient(peer[0], peer[1], self._secret, self._source)
        try:
            return client.get(shard, into)
        finally:
            client.close()

    def hang_up(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, {}
        for client in kept.values():
            client.close()
