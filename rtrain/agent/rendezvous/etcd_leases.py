"""EtcdLeases: agent leases as etcd leases.

Each agent holds one etcd lease with TTL = heartbeat_timeout (whole seconds). Its
keep-alive, every heartbeat_interval from a thread of its own, is the heartbeat; the
agent's lease key of each generation is bound to it. When an agent stops renewing
(dead, SIGSTOPped, cut off), etcd itself expires the lease and deletes the key: no peer
judges another's clock or polls its counter. Each agent follows a spread few peers'
keys (watched_peers, as StoreLeases reads them) on its one watch stream (JobWatch),
and whoever sees a key go records the loss in the ledger for everyone: a generation's
lease writes reach three watchers each, not every node.

A fenced agent, one whose lease lapsed while it was stopped, learns it from etcd at
its next keep-alive: the lease is gone, and every write bound to it is refused. It
reports the lapse (Leases.lapsed), takes a new lease, and binds a key again only
when it holds a place in a new generation, so it can never revive the old one.

A member that does not answer (frozen: it accepts connections and answers nothing) is
left within a quarter of the lease, by the keeper and the store's client alike
(EtcdClient.limit_attempts), so a keep-alive that tried it first still renews in time.
And a peer whose key vanished is declared lost only once this node's own lease was
renewed after it saw the key go: when every node's lease lapses at once (etcd, or the
way to it, stalled for everyone), each node finds its own lapsed too, and none is
declared lost or charged for what none of them did.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable

from ...core.clock import Clock
from ...core.errors import RendezvousError, StoreUnavailable, first_line
from ...core.rendezvous.liveness import watched_peers
from ...core.rendezvous.protocol import StoreKeys
from ..store.etcd.store import EtcdKeyValueStore
from ..store.etcd.wire import LeaseNotFound
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

MIN_TTL_S = 2  # etcd refuses shorter leases on default election settings
NEVER_SEEN_TIMEOUTS = 3
# A request waits at most this share of the lease on one member before the next: a
# failover and the answer fit in a third of it.
ATTEMPT_SHARE = 0.25
KEPT_GENERATIONS = 8  # which lease bound each of the last few generations' keys


class EtcdLeases:
    def __init__(
        self,
        store: EtcdKeyValueStore,
        keys: StoreKeys,
        timeout: float,
        interval: float,
        own_thread: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """own_thread=False: the keep-alive is the caller's to drive, renew_once() every
        interval (a simulator of many agents on one event loop); clock: when a
        keep-alive was sent, and the peers' watches' times (compared with it)."""
        self._own_thread = own_thread
        self._clock = clock
        self._store = store
        self._keys = keys
        self.ttl = max(MIN_TTL_S, math.ceil(timeout))
        store.client.limit_attempts(self.ttl * ATTEMPT_SHARE)  # copies made later too
        self._client = store.client.copy()  # the keeper's own connection
        self._interval = interval
        self._timeout = timeout
        self._key: str | None = None
        self._generation: int | None = None
        self._bound: str | None = None
        self._lease = 0
        self._lease_of: dict[int, int] = {}  # generation -> the lease its key was bound to
        self._renewed: float | None = None  # when the last good keep-alive of _lease was sent
        self._lapsed: int | None = None
        self._store_lost: StoreUnavailable | None = None
        self._binding = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- Leases --

    def hold(self, generation: int, node_rank: int) -> None:
        with self._binding:  # read together by the keeper's _bind
            self._key = self._keys.lease(generation, node_rank)
            self._generation = generation
        # The key is written here, on the caller's thread, so that it exists as soon as
        # this node takes its place; renewals are the thread's.
        with contextlib.suppress(RendezvousError):
            self._bind()
        if self._thread is None and self._own_thread:
            self._thread = threading.Thread(target=self._run, name="rtrain-etcd-lease", daemon=True)
            self._thread.start()
        self._wake.set()

    def lapsed(self) -> int | None:
        return self._lapsed

    def renewed_at(self) -> float | None:
        """When (the clock's now) the last keep-alive etcd answered for the lease held now
        was sent; None before the first."""
        return self._renewed

    def _renewed_since(self, generation: int, since: float) -> bool:
        """Whether the lease bound to generation's key was renewed by a keep-alive sent
        after `since`: this node was alive in that generation after `since`."""
        # Not under _binding, which the keeper holds through a grant (up to the store's
        # deadline); read in this order, a lapse between the reads reads as not renewed
        # (it clears _renewed first, and a new lease is granted only after a lapse).
        renewed = self._renewed
        held = self._lease
        bound = self._lease_of.get(generation)
        return bound is not None and bound == held and renewed is not None and renewed > since

    def raise_if_store_lost(self) -> None:
        if self._store_lost is not None:
            raise self._store_lost

    def peers(self, generation: int, node_rank: int, num_nodes: int) -> EtcdPeerLeases:
        # A spread few peers' keys, on the node's one watch stream (JobWatch): etcd
        # decides expiry, and whoever sees a key go records the loss for everyone (the
        # ledger). A watch of every peer's key (the lease prefix) delivered every
        # node's lease writes to every node: N^2 events a generation.
        watched = watched_peers(node_rank, num_nodes)
        keys = [self._keys.lease(generation, n) for n in watched]
        watch = self._store.job_watch

        def present() -> dict[str, bytes]:
            return {key: value for key in keys if (value := watch.value(key)) is not None}

        return EtcdPeerLeases(
            present,
            self._keys,
            generation,
            watched,
            self._timeout,
            self._clock,
            alive_since=lambda since: self._renewed_since(generation, since),
            renew_now=self._wake.set,
        )

    def close(self) -> None:
        # The lease is left to expire rather than revoked: a peer still finishing must
        # not read this node's clean exit as a loss before the exit barrier.
        self._closed.set()
        self._wake.set()

    # -- the keeper thread --

    def _run(self) -> None:
        while self.renew_once():
            self._wake.wait(self._interval)
            self._wake.clear()

    def renew_once(self) -> bool:
        """One keep-alive (a lapse found is handled); False once closed or the store is
        lost: no renewal follows."""
        if self._closed.is_set() or self._store_lost is not None:
            return False
        try:
            self._renew()
        except LeaseNotFound:
            self._on_lapse()
        except StoreUnavailable as exc:  # past the join timeout: the job cannot go on
            self._store_lost = exc
            return False
        except RendezvousError as exc:  # the main thread's own calls report the store
            logger.warning("lease renewal failed: %s", first_line(exc))
        return True

    def _bind(self) -> None:
        """Hold a lease, and bind the current generation's key to it once."""
        with self._binding:
            if not self._lease:
                self._lease = self._client.grant(self.ttl)
                self._renewed = None
                logger.info("holding etcd lease %x (ttl %ds)", self._lease, self.ttl)
            key = self._key
            if key is not None and key != self._bound:
                self._client.put(key, str(self._lease), lease=self._lease)
                self._bound = key
                if self._generation is not None:
                    self._lease_of[self._generation] = self._lease
                    for old in sorted(self._lease_of)[:-KEPT_GENERATIONS]:
                        del self._lease_of[old]

    def _renew(self) -> None:
        self._bind()
        lease, sent = self._lease, self._clock.now()
        if self._client.keepalive(lease) <= 0:
            raise LeaseNotFound("the lease expired")
        with self._binding:
            if self._lease == lease:
                self._renewed = sent

    def _on_lapse(self) -> None:
        logger.warning(
            "fenced: etcd expired this node's lease %x in generation %s (not renewed for "
            "%ds: the agent was stopped or cut off); its lease key is gone and writes under "
            "the lease are refused; a new lease is taken for the next generation",
            self._lease,
            self._generation,
            self.ttl,
        )
        with self._binding:
            self._renewed = None  # first: _renewed_since reads it without the lock
            self._lapsed = self._generation
            self._lease = 0
            self._bound = self._key  # never bind the lapsed generation's key again


class EtcdPeerLeases:
    """The peers' lease keys of one generation, as one watch sees them: a peer whose key
    was seen and is gone was expired by etcd (lost now); one whose key never appeared
    within NEVER_SEEN_TIMEOUTS lease timeouts never took its place (the longer wait is
    for a peer slow to start, e.g. on a loaded machine: only a dead one pays it).

    alive_since(t): whether this node's own lease was renewed by a keep-alive sent after
    t. Given, a peer is named only once that holds for the time its key was first found
    gone (renew_now asks the keeper for that keep-alive at once): a node whose own lease
    lapsed in the same stall names nobody."""

    def __init__(
        self,
        present: Callable[[], dict[str, bytes]],
        keys: StoreKeys,
        generation: int,
        peers: list[int],
        timeout: float,
        clock: Clock = SYSTEM_CLOCK,
        alive_since: Callable[[float], bool] | None = None,
        renew_now: Callable[[], None] | None = None,
    ) -> None:
        self.generation = generation
        self.timeout = timeout
        self._present = present  # the generation's lease keys, as the watch has them
        self._by_key = {keys.lease(generation, n): n for n in peers}
        self._seen: set[int] = set()
        self._gone_at: dict[int, float] = {}
        self._clock = clock
        self._since = clock.now()
        self._alive_since = alive_since
        self._renew_now = renew_now

    def stale(self) -> list[int]:
        present = self._present()
        now = self._clock.now()
        late = now - self._since > NEVER_SEEN_TIMEOUTS * self.timeout
        stale = []
        unconfirmed = False
        for key, node in self._by_key.items():
            if key in present:
                self._seen.add(node)
            elif node in self._seen or late:
                gone_at = self._gone_at.setdefault(node, now)
                if self._alive_since is None or self._alive_since(gone_at):
                    stale.append(node)
                else:
                    unconfirmed = True
        if unconfirmed and self._renew_now is not None:
            self._renew_now()
        return sorted(stale)

    def forget(self, node: int) -> None:
        self._by_key = {k: n for k, n in self._by_key.items() if n != node}
        self._gone_at.pop(node, None)

    def last_seen(self, node: int) -> float | None:
        """Not known: etcd keeps the lease's TTL, the watch sees only present or gone."""
        return None
