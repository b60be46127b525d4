"""How a job ends: the exit barrier's counters and the abort record (JobEndRecords), and
what one node does at the end (JobEnd).

The agent that hosts the rendezvous store must be the last to leave: it waits until
every peer has seen the barrier pass (or read the abort record) before its store, and
with it the job's state, goes away.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.clock import Clock
from ...core.errors import RendezvousError, RendezvousTimeout, RtrainError
from ...core.rendezvous.failures import FailureRecord
from ...core.rendezvous.protocol import AbortRecord, Membership, ProtocolError, StoreKeys
from ..store.kv import KeyValueStore, increment, wrote
from ..waiting import SYSTEM_CLOCK

if TYPE_CHECKING:
    from ..generation import Generation
    from .job import JobRendezvous

POLL_S = 0.02
HOST_POLL_S = 0.2
# The abort record is read at most this often: every loop checks it on every pass (a
# waiting round at 20-100 ms), and an abort, the end of the job, can wait a second;
# on TCPStore each read is a request to the one store of the whole job.
ABORT_CHECK_S = 1.0

logger = logging.getLogger(__name__)


class JobAborted(Exception):
    def __init__(self, record: AbortRecord) -> None:
        super().__init__(record.reason)
        self.record = record


class JobEndRecords:
    """The store's side of a job's end: per generation, the nodes done and exited; for
    the job, the abort record (first writer wins) and its acknowledgements."""

    def __init__(self, store: KeyValueStore, keys: StoreKeys, clock: Clock = SYSTEM_CLOCK) -> None:
        self._abort_now: Callable[[], bytes | None] | None = None
        self._store = store
        self._keys = keys
        self._clock = clock
        self._next_abort_read = float("-inf")

    def mark_done(self, generation: int) -> None:
        increment(self._store, self._keys.done(generation))

    def done_count(self, generation: int) -> int:
        return self._store.counter(self._keys.done(generation))

    def mark_exited(self, generation: int) -> None:
        increment(self._store, self._keys.exited(generation))

    def exited_count(self, generation: int) -> int:
        return self._store.counter(self._keys.exited(generation))

    def ack_abort(self) -> None:
        increment(self._store, self._keys.abort_acks)

    def abort_acks(self) -> int:
        return self._store.counter(self._keys.abort_acks)

    def abort(self, record: AbortRecord) -> bool:
        """Write the abort record unless one exists; True if this call wrote it. The
        generation's news wakes its members, who would otherwise read the record only
        on their next sweep."""
        first = wrote(self._store, self._keys.abort, record.encode())
        self._store.set(self._keys.news(record.generation), "abort")
        return first

    def read_abort(self) -> AbortRecord | None:
        payload = self._store.get(self._keys.abort)
        if payload is None:
            return None
        try:
            return AbortRecord.decode(payload)
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's abort key in the store: {exc}") from None

    def raise_if_aborted(self) -> None:
        """Checked on every pass of every loop, read at most every ABORT_CHECK_S: through
        the store's watch of the abort key where it has one (etcd: no store traffic)."""
        if self._clock.now() < self._next_abort_read:
            return
        self._next_abort_read = self._clock.now() + ABORT_CHECK_S
        if self._abort_now is None:
            self._abort_now = self._store.follow(self._keys.abort)
        if self._abort_now() is not None:
            record = self.read_abort()
            if record is not None:
                raise JobAborted(record)


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

    def end_job(self, gen: Generation | None, code: int, reason: str) -> None:
        """Write the abort record (first writer wins) so every other agent ends too."""
        node = gen.node_rank if gen is not None else -1
        generation = gen.number if gen is not None else 0
        try:
            record = AbortRecord(generation, node, reason, code)
            if not self._ends.abort(record):
                self._ends.ack_abort()  # another node ended it first (a layout verdict is shared)
            self.linger_after_abort(gen.num_nodes - 1 if gen is not None else 0)
        except RendezvousError:
            pass  # the store is gone too: nobody is left to tell

    def read_abort(self, gen: Generation | None, record: AbortRecord) -> list[FailureRecord]:
        """Acknowledge another node's abort; the failures it left in the store."""
        try:
            self._ends.ack_abort()
            if gen is not None:
                return self._rdzv.ledger.failures(record.generation, gen.num_nodes)
        except RendezvousError:
            pass
        return []

    def explain(self, gen: Generation | None, exc: RtrainError, min_nodes: int) -> str:
        """Add what this node knows about lost peers to a rendezvous timeout."""
        if gen is None or not isinstance(exc, RendezvousTimeout):
            return str(exc)
        try:
            lost = self._rdzv.ledger.lost_nodes(gen.number, gen.num_nodes)
        except RendezvousError:
            return str(exc)
        if not lost:
            return str(exc)
        names = ", ".join(f"node {n} ({gen.membership.members[n].addr})" for n in lost)
        return (
            f"{exc}; lost in generation {gen.number}: {names}, and --nnodes needs at least "
            f"{min_nodes} nodes (add a node, or requeue: exit 75)"
        )
