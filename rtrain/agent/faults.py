"""FaultPolicy: what an agent does about a fault, and what it costs the job.

- A peer whose lease expired is declared lost in the store (the first declarer wins,
  so the loss is recorded and counted once) and the job moves to the next generation.
- A hung worker has its stack taken and is killed, so the worker-failure path below
  records and recovers it like any other.
- A worker failure is recorded; only the first node to report one in a generation is
  charged a restart, and the charge is refunded when the failure turns out to be the
  loss of a peer node. A node's losses, and the failures it was the root cause of
  (charged when the next round closes), count against --max-node-failures, which
  excludes a flapping node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..core.clock import Clock
from ..core.config.component_specs import FaultPart
from ..core.errors import ExitCode
from ..core.rendezvous.decisions import Charge, charge_for_failure
from ..core.rendezvous.failures import FailureKind, FailureRecord, root_cause_first
from ..core.rendezvous.protocol import Membership
from ..core.rendezvous.restart_budget import RestartBudget
from .generation import Generation, Joined
from .health.gpu_monitor import GpuFault
from .health.guard import HealthGuard
from .observe.events import emit_failure
from .rendezvous.job import JobRendezvous
from .rendezvous.lease import PeerWatch
from .waiting import SYSTEM_CLOCK
from .workers.group import WorkerGroup
from .workers.hang_watch import HangWatch, inspect_hang

logger = logging.getLogger(__name__)


@dataclass
class GiveUp:
    """The job cannot go on: why, with the failures recorded in the store."""

    reason: str
    failures: list[FailureRecord]
    exit_code: int = ExitCode.JOB_FAILED


class FaultPolicy:
    def __init__(
        self,
        rdzv: JobRendezvous,
        part: FaultPart,
        addr: str,
        check_signal: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._rdzv = rdzv
        self._clock = clock
        self._part = part
        self._addr = addr
        self._check_signal = check_signal
        self.budget = RestartBudget(part.max_restarts)

    # -- lost nodes --

    def lost(self, gen: Generation) -> list[int]:
        return self._rdzv.ledger.lost_nodes(gen.number, gen.num_nodes)

    def check_peers(self, gen: Generation) -> bool:
        """Declare every peer whose lease expired; True if any did."""
        return self.check_leases(gen.membership, gen.node_rank, gen.peers)

    def check_leases(self, membership: Membership, node_rank: int, peers: PeerWatch) -> bool:
        stale = peers.stale()
        if stale and self._rdzv.rounds.closed_membership(membership.generation + 1) is not None:
            # The job went on from this generation without this node (stopped or cut off
            # past its lease): its peers renew the next generation's leases, not these.
            # They went on; they are not lost, and are neither declared nor charged.
            for node in stale:
                peers.forget(node)
            return True
        for node in stale:
            self._declare_lost(membership, node_rank, peers.timeout, node)
            peers.forget(node)
        if stale:
            self._rdzv.rounds.open_next_round(membership.generation)
        return bool(stale)

    def _declare_lost(
        self, membership: Membership, my_rank: int, timeout: float, node: int
    ) -> None:
        generation = membership.generation
        addr = membership.members[node].addr
        record = FailureRecord(
            kind=FailureKind.LOST_NODE,
            generation=generation,
            node_rank=node,
            host=addr,
            time=self._clock.wall(),
            message=(
                f"lease not renewed for {timeout:g}s (agent, machine or network gone); "
                f"detected by node {my_rank}"
            ),
        )
        if not self._rdzv.declare_lost(generation, node, my_rank, record):
            return  # another agent declared it first and recorded it
        logger.warning(
            "node %d (%s) lost: its lease was not renewed for %gs; starting generation %d "
            "without it",
            node,
            addr,
            timeout,
            generation + 1,
        )
        # it stopped at its last renewal: a lease timeout ago, at the latest
        emit_failure(record, detect_s=timeout, fault_t=record.time - timeout)
        self._rdzv.ledger.charge(generation, addr, "lost")

    def survivors(self, last: Joined | None) -> Callable[[], set[str]] | None:
        """For closing the next round: the node ids of the last generation still alive."""
        if last is None:
            return None
        membership, node_rank, peers = last.membership, last.node_rank, last.peers

        def alive() -> set[str]:
            self.check_leases(membership, node_rank, peers)
            ledger = self._rdzv.ledger
            lost = set(ledger.lost_nodes(membership.generation, len(membership.members)))
            return {m.node_id for n, m in enumerate(membership.members) if n not in lost}

        return alive

    def last_seen(self, last: Joined | None) -> Callable[[str], float | None] | None:
        """For the rendezvous' progress: seconds since a node of the last generation
        (by node id) was last seen renewing its lease, where the leases say."""
        if last is None:
            return None
        membership, peers = last.membership, last.peers

        def seen(node_id: str) -> float | None:
            rank = membership.node_rank_of(node_id)
            return None if rank is None else peers.last_seen(rank)

        return seen

    def log_fenced(self, gen: Generation) -> None:
        """Why this node's generation ended under it."""
        if gen.node_rank in self.lost(gen):
            logger.warning(
                "fenced: the other nodes found this node's lease expired in generation %d and "
                "went on without it; stopping its workers and rejoining",
                gen.number,
            )
        else:
            # this node's workers are then repaired in place or restarted: the next
            # lines say which (agent/repair/coordinator.py)
            logger.info("another node started generation %d; joining it", gen.number + 1)

    # -- worker failures --

    def record_failures(self, gen: Generation) -> None:
        """Record workers that failed on their own while the job moved to the next
        generation (another node reported first): the root cause may be among them, and
        it is charged when the next round closes. No restart is claimed."""
        for record in gen.group.failure_records(self._addr):
            self._rdzv.ledger.record_failure(record)
            emit_failure(record)

    def recover(
        self,
        gen: Generation,
        fault: GpuFault | None,
        health: HealthGuard | None,
        repaired: bool = False,
    ) -> GiveUp | None:
        """Record this node's failure (its workers', or a GPU fault that restarts them);
        a GiveUp if the job cannot go on. repaired: a repair in place kept some workers."""
        restart_for = None
        if fault is not None and health is not None:
            logger.warning("restarting the workers: %s", fault.describe())
            restart_for = [health.record(fault, gen.number, gen.node_rank, self._addr)]
        return self.after_local_failure(gen, restart_for, repaired)

    def after_local_failure(
        self, gen: Generation, failures: list[FailureRecord] | None = None, repaired: bool = False
    ) -> GiveUp | None:
        """Record this node's failures (its failed workers, already stopped, unless given:
        a GPU fault that restarts them); None to restart the job."""
        failures = failures or gen.group.failure_records(self._addr)
        for record in failures:
            self._rdzv.ledger.record_failure(record)
            emit_failure(record)
        what = _what_failed(root_cause_first(failures)[0])
        first_reporter = self._rdzv.ledger.claim_restart(gen.number)
        exhausted = self.budget.exhausted
        # core's decision, on what is known; CHECK_PEERS is an action, performed here (a
        # wait of one lease timeout), and the decision is asked again with what it found.
        peer_lost: bool | None = None
        while (charge := charge_for_failure(first_reporter, exhausted, peer_lost)) is (
            Charge.CHECK_PEERS
        ):
            peer_lost = self._peer_loss_explains(gen)
        if charge is Charge.NOT_FIRST:
            logger.info(
                "%s after another node reported a failure; this node is not charged a restart",
                what,
            )
            return None
        if charge is Charge.PEER_LOST:
            logger.info("%s because a peer node was lost", what)
            return None
        if charge is Charge.GIVE_UP:
            reason = f"{what}; max_restarts={self._part.max_restarts} exhausted"
            stopped = gen.group.stopped_records(self._addr)
            return GiveUp(reason, self._rdzv.ledger.failures(gen.number, gen.num_nodes) + stopped)
        self.budget.charge(gen.number)
        logger.warning(
            "%s; %s (%d of %d restarts used)",
            what,
            "repairing in place" if repaired else "restarting the job",
            self.budget.used,
            self._part.max_restarts,
        )
        return None

    def _peer_loss_explains(self, gen: Generation) -> bool:
        """Before giving up: wait one lease timeout to see whether a peer node is gone."""
        if gen.num_nodes < 2:
            return False

        def peer_lost() -> bool:
            self._check_signal()
            self.check_peers(gen)
            return bool(self.lost(gen))

        return self._clock.wait_until(
            peer_lost,
            gen.peers.timeout + self._part.heartbeat_interval,
            self._part.monitor_interval,
        )

    def settle(self, previous: Generation | None, gen: Generation) -> None:
        """At a new generation: a restart charged for one that lost a node is refunded."""
        if previous is not None and self.budget.settle(
            [m.node_id for m in previous.membership.members],
            [m.node_id for m in gen.membership.members],
            gen.number,
        ):
            logger.info(
                "a node of generation %d was lost: its restart is not charged", previous.number
            )


def _what_failed(record: FailureRecord) -> str:
    if record.rank is None:  # a node-level finding (a GPU fault), not a worker
        return f"node {record.node_rank} failed ({record.kind}: {record.message})"
    return (
        f"worker rank {record.rank} on node {record.node_rank} failed "
        f"({record.kind} {record.describe_exit()})"
    )


def kill_hung(group: WorkerGroup, hangs: HangWatch, hung: list[int]) -> None:
    """Take each hung worker's stack into its failure record, then kill it.

    One hung rank leaves its peers waiting in a collective, so they go silent too.
    The likely culprit is killed (and so recorded) first: a held process (stopped, or in
    state D), or one that is not a victim (waiting in a collective, or exiting after a
    collective error); the victims after it.
    """
    by_rank = {w.local_rank: w for w in group.workers}
    found = [
        (by_rank[r], inspect_hang(hangs, r, by_rank[r].pid, by_rank[r].error_file)) for r in hung
    ]
    found.sort(key=lambda item: (not item[1].held, item[1].victim, item[0].local_rank))
    for worker, finding in found:
        group.kill_hung(worker, finding)
