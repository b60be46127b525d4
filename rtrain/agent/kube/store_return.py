"""The job's TCPStore lost with its host's pod, and back at the same name.

Over TCPStore (c10d, static) one node's agent hosts the job's store; on Kubernetes
that pod may be evicted or lost like any other, and its replacement (the same name:
Kubernetes keeps it, with a new address) hosts a new, empty store. So under
Kubernetes the other nodes do not end the job when the store goes (exit 75 within
seconds, before): they stop their workers, keep their snapshots in memory, wait up to
join_timeout for a store at the same name (agent/store/opening.py's wait), and carry
the job over to it:

- the round counter is raised past the last generation they ran, so that generation
  numbers only grow (the snapshots in memory are kept by generation), and that
  generation's membership is written where a node joining late reads the grid
  before its own from (every node computes the same grid from the same memberships);
- a job secret that was handed out through the lost store is handed out again, so
  the replacement signs and checks shards with the one the survivors hold.

The replacement's agent, waiting in round 0 of its fresh store, finds the counter
moved past its round and joins the next (agent/rendezvous/rounds.py); the job goes on
at generation N + 1 and restores from the survivors' memory. The etcd backend has no
such host and needs none of this (README recommends it on Kubernetes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ...core.config.launch_spec import LaunchSpec
from ...core.errors import RtrainError, StoreUnavailable
from ...core.rendezvous.protocol import Membership
from ..rendezvous.job import JobRendezvous
from .eviction import KUBERNETES_VARIABLE

logger = logging.getLogger(__name__)


class StoreReturn:
    """What a node carries from a lost TCPStore to the one at the same name."""

    def __init__(self, spec: LaunchSpec, environ: Mapping[str, str]) -> None:
        self._spec = spec
        self._on_kubernetes = bool(environ.get(KUBERNETES_VARIABLE))
        self._last: Membership | None = None  # the last generation this node ran
        self._secret: bytes | None = None

    def waits_for(self, exc: RtrainError, hosted_here: bool) -> bool:
        """Whether this loss of the store is one to wait out (TCPStore, hosted by another
        node's pod, under Kubernetes)."""
        return (
            isinstance(exc, StoreUnavailable)
            and self._on_kubernetes
            and not self._spec.rdzv.is_etcd
            and not hosted_here
        )

    def lost(self, last: Membership | None, secret: bytes | None) -> None:
        """The store is gone: remember the generation to carry over, and the secret."""
        self._last = last if last is not None else self._last
        self._secret = secret
        logger.warning(
            "lost the rendezvous store at %s:%d with its host's pod; waiting up to %gs "
            "(join_timeout) for its replacement's store at the same name",
            self._spec.rdzv.host,
            self._spec.rdzv.port,
            self._spec.rdzv.join_timeout,
        )

    def carry_over(self, rdzv: JobRendezvous) -> None:
        """On the store at the same name: the last generation's membership, the round
        counter past it, the job secret (each written once, whoever comes first)."""
        last = self._last
        if last is None:
            return
        store, keys = rdzv.store, rdzv.keys
        if self._secret is not None:
            store.set_once(keys.secret, self._secret)
        store.set_once(keys.closed(last.generation), last.encode())
        floor = last.generation + 1
        current = moved_from = rdzv.rounds.current_round()
        while current < floor:
            current = int(store.compare_set(keys.round, str(current), str(floor)))
        if moved_from < floor:  # a generation running there (a replacement alone) fences
            store.set(keys.news(moved_from), "round")
        logger.info(
            "the rendezvous store is back: the job goes on from generation %d (round %d)",
            last.generation,
            current,
        )
        self._last = None
