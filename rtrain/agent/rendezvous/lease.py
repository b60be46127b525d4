"""Agent leases: this node renews its own, and watches its peers' for expiry.

Leases is the seam: a keeper of this node's lease and a watch of its peers', one per
backend. StoreLeases is the TCPStore one, here; EtcdLeases (etcd_leases.py) uses
etcd's own leases, whose expiry etcd decides.

LeaseKeeper renews from its own thread and its own store connection, so a slow
worker shutdown or a long rendezvous on the main thread never lets the lease lapse;
only a dead, stopped or cut-off agent stops renewing. PeerLeases runs on the main
thread and judges the peers with core's StalenessTracker (the observer's clock only).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ...core.clock import Clock
from ...core.errors import first_line
from ...core.rendezvous.liveness import StalenessTracker, watched_peers
from ...core.rendezvous.protocol import ProtocolError, StoreKeys, decode_int
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)


@runtime_checkable
class PeerWatch(Protocol):
    """The peers' leases of one generation; stale() names the node ranks that expired."""

    generation: int
    timeout: float

    def stale(self) -> list[int]: ...

    def forget(self, node: int) -> None: ...

    def last_seen(self, node: int) -> float | None:
        """Seconds since the node's lease was last seen renewed (None: not known)."""
        ...


@runtime_checkable
class Leases(Protocol):
    def hold(self, generation: int, node_rank: int) -> None:
        """Keep this node's lease of (generation, node_rank) alive from now on."""
        ...

    def lapsed(self) -> int | None:
        """The generation whose lease the store let lapse under this node (it was
        stopped or cut off past the timeout: fenced), or None."""
        ...

    def raise_if_store_lost(self) -> None:
        """Raise StoreUnavailable once renewals found the store gone for good (past its
        deadline): where the main thread reads only watches, this is how it learns."""
        ...

    def peers(self, generation: int, node_rank: int, num_nodes: int) -> PeerWatch:
        """A watch of the generation's peers' leases, as node_rank of num_nodes."""
        ...

    def close(self) -> None: ...


class StoreLeases:
    """Leases as counters in the store: each agent renews its own (LeaseKeeper) and
    judges its peers' by whether theirs moved (PeerLeases)."""

    def __init__(
        self,
        store: KeyValueStore,
        connect: Callable[[], KeyValueStore],
        keys: StoreKeys,
        timeout: float,
        interval: float,
        clock: Clock = SYSTEM_CLOCK,
        own_thread: bool = True,
    ) -> None:
        """own_thread=False: nothing renews until the caller drives keeper.renew_once()
        every interval (a simulator of many agents on one event loop)."""
        self._store = store
        self._keys = keys
        self._timeout = timeout
        self._interval = interval
        self._clock = clock
        self.keeper = LeaseKeeper(connect, keys, interval, own_thread)

    def hold(self, generation: int, node_rank: int) -> None:
        self.keeper.hold(generation, node_rank)

    def lapsed(self) -> int | None:
        return None  # a counter never lapses: the round counter fences this node

    def raise_if_store_lost(self) -> None:
        pass  # the main thread reads the TCPStore itself on every pass

    def peers(self, generation: int, node_rank: int, num_nodes: int) -> PeerLeases:
        # Each read costs the store a lookup per lease: a spread few peers each, and
        # whoever finds one expired records it in the ledger for everyone.
        watched = watched_peers(node_rank, num_nodes)
        return PeerLeases(
            self._store, self._keys, generation, watched, self._timeout, self._interval, self._clock
        )

    def close(self) -> None:
        self.keeper.close()


class LeaseKeeper:
    def __init__(
        self,
        connect: Callable[[], KeyValueStore],
        keys: StoreKeys,
        interval: float,
        own_thread: bool = True,
    ) -> None:
        """own_thread=False: the connection is opened now, on the caller's thread, and
        renew_once() is the caller's to call every interval."""
        self._connect = connect
        self._keys = keys
        self._interval = interval
        self._key: str | None = None
        self._seq = 0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._store: KeyValueStore | None = None
        # Its connection is opened now, before any lease is held: a TCPStore server
        # stalls every client while it looks up a new one's name (for the resolver's
        # timeout on a host without DNS), which must not delay the other nodes' renewals.
        if own_thread:
            self._thread = threading.Thread(target=self._run, name="rtrain-lease", daemon=True)
            self._thread.start()
        else:
            self._store = connect()

    def hold(self, generation: int, node_rank: int) -> None:
        """Renew the lease of (generation, node_rank) from now on; renews once right away."""
        self._key = self._keys.lease(generation, node_rank)
        self._wake.set()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def renew_once(self) -> bool:
        """Renew the lease held now (if any); False once closed or the store failed:
        no renewal follows."""
        if self._closed.is_set() or self._store is None:
            return False
        key = self._key
        if key is not None:
            self._seq += 1
            try:
                self._store.set(key, str(self._seq))
            except Exception as exc:  # the main thread reports the lost store
                logger.warning("lease renewal stopped: %s", first_line(exc))
                self._store = None
                return False
        return True

    def _run(self) -> None:
        try:
            self._store = self._connect()
        except Exception as exc:  # the main thread's own store calls end the run
            logger.error("cannot renew this node's lease: %s", first_line(exc))
            return
        while self.renew_once():
            self._wake.wait(self._interval)
            self._wake.clear()


class PeerLeases:
    """The peers' leases of one generation; stale() names the node ranks that expired."""

    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        generation: int,
        peers: list[int],
        timeout: float,
        interval: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.generation = generation
        self.timeout = timeout
        self._store = store
        self._keys = keys
        self._peers = peers
        self._tracker: StalenessTracker[int] = StalenessTracker(timeout)
        self._interval = interval / 2
        self._clock = clock
        self._next = 0.0

    def stale(self) -> list[int]:
        now = self._clock.now()
        if now < self._next:
            return []
        self._next = now + self._interval
        # Every peer's lease in one request (one round trip on TCPStore when all are
        # set), not two per peer: the watch costs each agent O(1) round trips.
        peers = list(self._peers)
        payloads = self._store.multi_get([self._keys.lease(self.generation, n) for n in peers])
        for node, payload in zip(peers, payloads, strict=True):
            self._tracker.observe(node, self._count(node, payload), now)
        return self._tracker.stale(self._clock.now())

    @staticmethod
    def _count(node: int, payload: bytes | None) -> int | None:
        if payload is None:
            return None
        try:
            return decode_int(payload, f"lease of node {node}")
        except ProtocolError as exc:
            # Not trusted: counts as not renewed, so garbage cannot keep a dead node alive.
            logger.error("refusing %s", exc)
            return None

    @property
    def watched(self) -> list[int]:
        """The node ranks whose leases this watch reads."""
        return list(self._peers)

    def forget(self, node: int) -> None:
        if node in self._peers:
            self._peers.remove(node)
        self._tracker.forget(node)

    def last_seen(self, node: int) -> float | None:
        return self._tracker.silent_for(node, self._clock.now()) if node in self._peers else None
