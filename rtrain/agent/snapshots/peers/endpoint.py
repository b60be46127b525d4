"""ShardEndpoint: this node's end of the transport between agents, for one run.

It serves this node's shards and keeps its peers' replicas (ShardServer), admits only
the current generation's members (core.snapshots.admission: replicas from the nodes
placement sends them from, shards to the members), and holds the TcpTransport this
node's own sends and fetches go through, from its job address.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable

from ....core.rendezvous.protocol import Membership
from ....core.snapshots.admission import Admission, StepCeiling
from ....core.snapshots.restore_plan import ring_successors
from ..shard_store import ShardStore
from .server import ShardServer
from .transport import Address, TcpTransport

logger = logging.getLogger(__name__)


class ShardEndpoint:
    def __init__(self, host: str, secret: bytes, store: ShardStore, ceiling: StepCeiling) -> None:
        """host: this node's job address, the server's and every request's; ceiling: the
        newest step this node's workers committed (local_slots.py), which replicas are
        judged by."""
        self._host = host
        self._admission = Admission(ceiling=ceiling)
        self._server = ShardServer(host, secret, store, self._admission)
        self.transport = TcpTransport(secret, host)

    @property
    def address(self) -> Address:
        """Where the peers reach this node's server."""
        return self._host, self._server.port

    def admit(self, membership: Membership, node_rank: int, copies: int) -> None:
        """From now on serve this generation: replicas from the nodes placement sends
        them from, shards to its members only."""
        count = len(membership.members)
        senders = [
            m.addr
            for n, m in enumerate(membership.members)
            if node_rank in ring_successors(n, count, copies)
        ]
        self._admission.readers = frozenset(addresses_of(m.addr for m in membership.members))
        self._admission.senders = frozenset(addresses_of(senders))
        self._admission.generation = membership.generation

    def close(self) -> None:
        self._server.close()


def addresses_of(names: Iterable[str]) -> set[str]:
    """The IP addresses peers connect from, for each node address (a name or an IP)."""
    found: set[str] = set()
    for name in names:
        name = "127.0.0.1" if name == "localhost" else name
        found.add(name)
        try:
            found.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            logger.warning("cannot resolve node address %s", name)
    return found
