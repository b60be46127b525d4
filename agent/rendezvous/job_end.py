"""How a job ends on one node: the exit barrier, abort records, and what to tell the user.

The agent that hosts the rendezvous store must be the last to leave: it waits until
every peer has seen the barrier pass (or read the abort record) before its store, and
with it the job's state, goes away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...core.errors import RendezvousError, RtrainError
from ...core.rendezvous.failures import FailureRecord
from ...core.rendezvous.protocol import AbortRecord, Membership
from ..generation import Generation
from .rounds import StoreRendezvous

POLL_S = 0.02
HOST_POLL_S = 0.2

logger = logging.getLogger(__name__)


class JobEnd:
    def __init__(
        self,
        rdzv: StoreRendezvous,
        is_host: bool,
        close_timeout: float,
        check_signal: Callable[[], None],
    ) -> None:
        self._rdzv = rdzv
        self._is_host = is_host
        self._close_timeout = close_timeout
        self._check_signal = check_signal

    def exit_barrier(self, membership: Membership) -> bool:
        """Wait for every node to finish; False if the job moved to a new generation instead."""
        rdzv = self._rdzv
        generation, size = membership.generation, len(membership.members)
        rdzv.mark_done(generation)
        while rdzv.done_count(generation) < size:
            self._check_signal()
            rdzv.raise_if_aborted()
            if rdzv.round_moved_past(generation):
                return False
            time.sleep(POLL_S)
        rdzv.mark_exited(generation)
        if self._is_host:  # keep the store up until every node has seen the barrier pass
            self.wait_count(lambda: rdzv.exited_count(generation), size)
        return True

    def host_until_done(self, join_timeout: float) -> None:
        """A node that left the job but hosts the store keeps the store up, without
        workers, until the others finish, end the job, or give up forming a generation
        (none closes within join_timeout): the job's state must not leave with it."""
        if not self._is_host:
            return
        logger.info("this node hosts the rendezvous store: keeping it up until the job ends")
        rdzv, seen, since = self._rdzv, -1, time.monotonic()
        try:
            while True:
                self._check_signal()
                if rdzv.read_abort() is not None:
                    time.sleep(min(self._close_timeout, 5.0))  # let the others read why
                    return
                current = rdzv.current_round()
                if current != seen:
                    seen, since = current, time.monotonic()
                membership = rdzv.closed_membership(current)
                if membership is None:
                    if time.monotonic() - since > join_timeout:
                        return
                elif rdzv.exited_count(current) >= len(membership.members):
                    return
                time.sleep(HOST_POLL_S)
        except RendezvousError:
            return

    def linger_after_abort(self, peers: int) -> None:
        """The host lets up to `peers` other agents read why before its store goes away."""
        if self._is_host:
            self.wait_count(self._rdzv.abort_acks, peers)

    def wait_count(self, read: Callable[[], int], expected: int) -> None:
        end = time.monotonic() + self._close_timeout
        try:
            while read() < expected and time.monotonic() < end:
                time.sleep(POLL_S)
        except RendezvousError:
            pass

    def end_job(self, gen: Generation | None, code: int, reason: str) -> None:
        """Write the abort record (first writer wins) so every other agent ends too."""
        node = gen.node_rank if gen is not None else -1
        generation = gen.number if gen is not None else 0
        try:
            record = AbortRecord(generation, node, reason, code)
            if not self._rdzv.abort(record):
                self._rdzv.ack_abort()  # another node ended it first (a layout verdict is shared)
            self.linger_after_abort(gen.num_nodes - 1 if gen is not None else 0)
        except RendezvousError:
            pass  # the store is gone too: nobody is left to tell

    def read_abort(self, gen: Generation | None, record: AbortRecord) -> list[FailureRecord]:
        """Acknowledge another node's abort; the failures it left in the store."""
        try:
            self._rdzv.ack_abort()
            if gen is not None:
                return self._rdzv.failures(record.generation, gen.num_nodes)
        except RendezvousError:
            pass
        return []

    def explain(self, gen: Generation | None, exc: RtrainError, min_nodes: int) -> str:
        """Add what this node knows about lost peers to a rendezvous timeout."""
        if gen is None or not str(exc).startswith("rendezvous timed out"):
            return str(exc)
        try:
            lost = self._rdzv.lost_nodes(gen.number, gen.num_nodes)
        except RendezvousError:
            return str(exc)
        if not lost:
            return str(exc)
        names = ", ".join(f"node {n} ({gen.membership.members[n].addr})" for n in lost)
        return (
            f"{exc}; lost in generation {gen.number}: {names}, and --nnodes needs at least "
            f"{min_nodes} nodes (add a node, or requeue: exit 75)"
        )
