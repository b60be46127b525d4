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
from ..core.errors import ExitCode, RendezvousError, RendezvousTimeout, RtrainError
from ..core.rendezvous.failures import FailureRecord
from ..core.rendezvous.place import Place
from ..core.rendezvous.protocol import AbortRecord, Membership
from .health.gpu_monitor import GpuFault
from .health.guard import Fault, HealthGuard, leave_job
from .observe.events import emit_failure
from .rendezvous.job import JobRendezvous
from .rendezvous.lease import PeerWatch
from .waiting import SYSTEM_CLOCK

POLL_S = 0.02
HOST_POLL_S = 0.2
# How often a node at the exit barrier reads the nodes marked lost there: a lease takes
# seconds to expire, and the barrier's own poll (POLL_S) is 50 reads a second a node.
LOST_READ_S = 1.0

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

    def exit_barrier(
        self, membership: Membership, peers: PeerWatch | None = None, me: int = -1
    ) -> bool:
        """Wait for every node to finish; False if the job moved to a new generation instead.

        peers: the generation's lease watch (me: this node's rank). A node whose lease
        expires while the others wait here (stopped, or lost, after its workers' last
        collective) is marked lost in the ledger, for the nodes that do not watch it, and
        not waited for: this node's workers finished, and a barrier with no bound would
        hold it forever. The next round is not opened (that would redo finished work):
        torchrun's exit barrier gives up on a silent node the same way, after its
        timeout; here its lease says so sooner."""
        rounds, ends, ledger = self._rdzv.rounds, self._ends, self._rdzv.ledger
        generation, size = membership.generation, len(membership.members)
        ends.mark_done(generation)
        moved = False
        gone: set[int] = set()
        next_lost_read = self._clock.now()

        def everyone_done() -> bool:
            nonlocal moved, next_lost_read
            if ends.done_count(generation) >= size - len(gone):
                return True
            self._check_signal()
            ends.raise_if_aborted()
            moved = rounds.round_moved_past(generation)
            if moved or peers is None:
                return moved
            for node in set(peers.stale()) - gone:
                ledger.mark_lost(generation, node, me)
            if self._clock.now() < next_lost_read:
                return False
            next_lost_read = self._clock.now() + LOST_READ_S
            for node in set(ledger.lost_nodes(generation, size)) - gone:
                gone.add(node)
                logger.warning(
                    "node %d's lease expired after this node finished; not waiting for it", node
                )
            return False

        self._clock.wait_until(everyone_done, None, POLL_S)
        if moved:
            return False
        ends.mark_exited(generation)
        if self._is_host:  # keep the store up until every node has seen the barrier pass
            self.wait_count(lambda: ends.exited_count(generation), size - len(gone))
        return True

    def finish(self, place: Place, peers: PeerWatch | None = None) -> list[FailureRecord] | None:
        """Every local worker succeeded: what the job recovered from (node 0 reports it,
        read before the barrier, after which the store's host may leave) once every node
        has; None if the job moved to another generation meanwhile."""
        history = self._rdzv.history(place.generation) if place.node_rank == 0 else []
        return history if self.exit_barrier(place.membership, peers, place.node_rank) else None

    def save_for_requeue(
        self, place: Place | None, why: str, directory: str | None, save: Callable[[], int | None]
    ) -> str:
        """Slurm is about to stop the job (time limit, preemption), and the workers are
        stopped: write their newest snapshots to --checkpoint-dir (save), tell the others,
        and say why, for exit 75 (the batch script, or RequeueExit=75, requeues it; the
        requeued job restores from disk)."""
        try:
            step = save()
        except OSError as exc:
            step, why = None, f"{why}; saving to {directory} failed: {exc}"
        if step is not None:
            why = f"{why}; saved step {step} to {directory}"
        elif not directory:
            why = f"{why}; nothing saved (no --checkpoint-dir)"
        logger.warning("%s; exiting %d to be requeued", why, ExitCode.TEMPFAIL)
        self.end_job(place, ExitCode.TEMPFAIL, why)
        return why

    def leave_for_fault(
        self,
        health: HealthGuard | None,
        fault: GpuFault | Fault,
        last: Place | None,
        addr: str,
        stop_workers: Callable[[], None],
        join_timeout: float,
    ) -> FailureRecord:
        """Leave the job for a fault of this node's own (a GPU's; a lasting straggler's,
        health None where no NVML watches): tell the others first (the one place a node
        is declared lost, JobRendezvous.leave: they put their workers' failures down to
        this node), then stop the workers; the store's host keeps it up until the others
        end."""
        generation, node_rank = (last.generation, last.node_rank) if last else (0, None)

        def tell(record: FailureRecord) -> None:
            assert node_rank is not None
            self._rdzv.leave(generation, node_rank, record)

        record = leave_job(fault, generation, node_rank, addr, tell, self._clock.wall())
        if health is not None and isinstance(fault, GpuFault):
            health.drain(fault)  # --drain-on-fault: for a GPU's fault, not a slow node's
        emit_failure(record)
        stop_workers()
        self.host_until_done(join_timeout)
        return record

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
