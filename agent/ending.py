"""JobEnd: what one node does at the end of the job: the exit barrier, hosting the
store until the others are done, the abort record it writes or reads, and what a
rendezvous timeout says about lost peers. It is given this node's place in the
generation (core/rendezvous/place.py), not the agent's Generation.

The agent that hosts the rendezvous store must be the last to leave: it waits until
every peer has seen the barrier pass (or read the abort record) before its store, and
with it the job's state, goes away.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from ..core.clock import Clock
from ..core.errors import RendezvousError, RendezvousTimeout, RtrainError
from ..core.rendezvous.failures import FailureRecord
from ..core.rendezvous.place import Place
from ..core.rendezvous.protocol import AbortRecord, Membership
from .rendezvous.job import JobRendezvous
from .waiting import SYSTEM_CLOCK

POLL_S = 0.02
HOST_POLL_S = 0.2

logger = logging.getLogger(__name__)


class JobEnd:
    def __init__(
        self,
        rdzv: JobRendezvous,
        is_host: bool,
        close_timeout: float,
        check_signal: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._rdzv = rdzv
        self._ends = rdzv.ends
        self._is_host = is_host
        self._close_timeout = close_timeout
        self._check_signal = check_signal
        self._clock = clock

    def exit_barrier(self, membership: Membership) -> bool:
        """Wait for every node to finish; False if the job moved to a new generation instead."""
        rounds, ends = self._rdzv.rounds, self._ends
        generation, size = membership.generation, len(membership.members)
        ends.mark_done(generation)
        moved = False

        def everyone_done() -> bool:
            nonlocal moved
            if ends.done_count(generation) >= size:
                return True
            self._check_signal()
            ends.raise_if_aborted()
            moved = rounds.round_moved_past(generation)
            return moved

        self._clock.wait_until(everyone_done, None, POLL_S)
        if moved:
            return False
        ends.mark_exited(generation)
        if self._is_host:  # keep the store up until every node has seen the barrier pass
            self.wait_count(lambda: ends.exited_count(generation), size)
        return True

    def host_until_done(self, join_timeout: float) -> None:
        """A node that left the job but hosts the store keeps the store up, without
        workers, until the others finish, end the job, or give up forming a generation
        (none closes within join_timeout): the job's state must not leave with it."""
        if not self._is_host:
            return
        logger.info("this node hosts the rendezvous store: keeping it up until the job ends")
        rounds, ends = self._rdzv.rounds, self._ends
        seen, since = -1, self._clock.now()
        aborted = False

        def job_over() -> bool:
            nonlocal seen, since, aborted
            self._check_signal()
            if ends.read_abort() is not None:
                aborted = True
                return True
            current = rounds.current_round()
            if current != seen:
                seen, since = current, self._clock.now()
            membership = rounds.closed_membership(current)
            if membership is None:
                return self._clock.now() - since > join_timeout
            return ends.exited_count(current) >= len(membership.members)

        try:
            self._clock.wait_until(job_over, None, HOST_POLL_S)
        except RendezvousError:
            return
        if aborted:
            self._clock.sleep(min(self._close_timeout, 5.0))  # let the others read why

    def linger_after_abort(self, peers: int) -> None:
        """The host lets up to `peers` other agents read why before its store goes away."""
        if self._is_host:
            self.wait_count(self._ends.abort_acks, peers)

    def wait_count(self, read: Callable[[], int], expected: int) -> None:
        with contextlib.suppress(RendezvousError):
            self._clock.wait_until(lambda: read() >= expected, self._close_timeout, POLL_S)

    def end_job(self, place: Place | None, code: int, reason: str) -> None:
        """Write the abort record (first writer wins) so every other agent ends too."""
        node = place.node_rank if place is not None else -1
        generation = place.generation if place is not None else 0
        try:
            record = AbortRecord(generation, node, reason, code)
            if not self._ends.abort(record):
                self._ends.ack_abort()  # another node ended it first (a layout verdict is shared)
            self.linger_after_abort(place.num_nodes - 1 if place is not None else 0)
        except RendezvousError:
            pass  # the store is gone too: nobody is left to tell

    def read_abort(self, place: Place | None, record: AbortRecord) -> list[FailureRecord]:
        """Acknowledge another node's abort; the failures it left in the store."""
        try:
            self._ends.ack_abort()
            if place is not None:
                return self._rdzv.ledger.failures(record.generation, place.num_nodes)
        except RendezvousError:
            pass
        return []

    def explain(self, place: Place | None, exc: RtrainError, min_nodes: int) -> str:
        """Add what this node knows about lost peers to a rendezvous timeout."""
        if place is None or not isinstance(exc, RendezvousTimeout):
            return str(exc)
        try:
            lost = self._rdzv.ledger.lost_nodes(place.generation, place.num_nodes)
        except RendezvousError:
            return str(exc)
        if not lost:
            return str(exc)
        names = ", ".join(f"node {n} ({place.addr_of(n)})" for n in lost)
        return (
            f"{exc}; lost in generation {place.generation}: {names}, and --nnodes needs at least "
            f"{min_nodes} nodes (add a node, or requeue: exit 75)"
        )
