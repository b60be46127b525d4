"""Leases, fencing and restart accounting, driven in process: FaultPolicy and PeerLeases
against torch's real HashStore behind the typed store, on a fake clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rtrain.agent.faults import FaultPolicy
from rtrain.agent.generation import Generation, Joined
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.rendezvous.lease import PeerLeases, StoreLeases
from rtrain.core.config.component_specs import fault_part
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import MemberInfo, Membership

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store

FLAGS = ("--nnodes=1:3", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")


@dataclass
class FailedGroup:
    """The worker group's side FaultPolicy reads: what failed and what was stopped."""

    failed: list[FailureRecord] = field(default_factory=list)

    def failure_records(self, host: str) -> list[FailureRecord]:
        return list(self.failed)

    def stopped_records(self, host: str) -> list[FailureRecord]:
        return []


class Job:
    """One node's view (node 0 of three) of a job on a shared in-memory store."""

    def __init__(self, *flags: str) -> None:
        self.clock = FakeClock()
        self.store = FaultyStore(memory_store())
        self.spec = launch_spec(*FLAGS, *flags)
        self.rdzv = JobRendezvous.over(self.store, self.spec, self.clock.clock)
        self.rdzv.rounds.current_round()  # generation 0 is running
        self.membership = Membership(0, [MemberInfo(f"id{n}", f"10.0.0.{n}", 1) for n in range(3)])
        self.policy = FaultPolicy(
            self.rdzv, fault_part(self.spec), "10.0.0.0", lambda: None, self.clock.clock
        )
        self.peers = PeerLeases(
            self.store, self.rdzv.keys, 0, [1, 2], 5.0, 1.0, clock=self.clock.clock
        )

    def renew(self, node: int, value: int) -> None:
        """What node's LeaseKeeper writes."""
        self.store.inner.set(self.rdzv.keys.lease(0, node), str(value))

    def keep_renewing(self, node: int, every: float = 1.0) -> None:
        count = [0]

        def beat() -> None:
            count[0] += 1
            self.renew(node, count[0])
            self.clock.at(every, beat)

        beat()

    def generation(self, failed: list[FailureRecord]) -> Generation:
        return Generation(
            self.membership,
            0,
            FailedGroup(failed),
            self.peers,
            None,
            None,  # type: ignore[arg-type]
        )


def exit_record(node: int = 0) -> FailureRecord:
    return FailureRecord(
        kind=FailureKind.EXIT,
        generation=0,
        node_rank=node,
        host="10.0.0.0",
        time=1.0,
        rank=node,
        exitcode=1,
    )


def test_a_peer_that_keeps_renewing_is_never_lost() -> None:
    job = Job()
    job.keep_renewing(1)
    job.keep_renewing(2)
    for _ in range(40):
        job.clock.sleep(0.5)
        assert job.peers.stale() == []


def test_a_silent_peer_is_lost_after_the_lease_timeout_and_declared_once() -> None:
    job = Job()
    job.keep_renewing(1)
    job.renew(2, 1)  # renews once, then its agent is SIGSTOPped
    declared_at = None
    while declared_at is None:
        job.clock.sleep(0.5)
        if job.policy.check_leases(job.membership, 0, job.peers):
            declared_at = job.clock.slept
    assert 5.0 <= declared_at <= 6.5
    assert job.rdzv.ledger.lost_nodes(0, 3) == [2]
    assert job.rdzv.rounds.round_moved_past(0)  # the survivors move on: node 2 is fenced
    lost = job.rdzv.ledger.failures(0, 3)
    assert [(r.kind, r.node_rank) for r in lost] == [(FailureKind.LOST_NODE, 2)]
    assert job.rdzv.ledger.node_failures("10.0.0.2") == 1
    assert not job.policy.check_leases(job.membership, 0, job.peers)  # forgotten after


def test_garbage_in_a_lease_cannot_keep_a_dead_node_alive() -> None:
    job = Job()
    job.keep_renewing(1)
    for value in ("x", "y", "z", "w", "v", "u", "t", "s", "r", "q", "p", "o", "n"):
        job.store.plant(job.rdzv.keys.lease(0, 2), value)  # changes, but is not a count
        job.clock.sleep(0.5)
        stale = job.peers.stale()
        if stale:
            break
    assert stale == [2]


def test_survivors_leave_out_the_nodes_found_lost() -> None:
    job = Job()
    job.keep_renewing(1)
    alive = job.policy.survivors(Joined(job.membership, 0, job.peers))
    assert alive is not None and alive() == {"id0", "id1", "id2"}
    job.clock.sleep(7.0)
    assert alive() == {"id0", "id1"}


def test_only_the_first_reporter_is_charged_a_restart() -> None:
    job = Job("--max-restarts=3")
    assert job.policy.after_local_failure(job.generation([exit_record()])) is None
    assert job.policy.budget.used == 1
    other = FaultPolicy(job.rdzv, fault_part(job.spec), "10.0.0.1", lambda: None, job.clock.clock)
    assert other.after_local_failure(job.generation([exit_record(1)])) is None
    assert other.budget.used == 0
    assert len(job.rdzv.ledger.failures(0, 3)) == 2


def test_an_exhausted_budget_gives_up_unless_a_peer_was_lost() -> None:
    job = Job("--max-restarts=0")
    job.keep_renewing(1)
    job.keep_renewing(2)
    give_up = job.policy.after_local_failure(job.generation([exit_record()]))
    assert give_up is not None and "max_restarts=0 exhausted" in give_up.reason
    assert give_up.exit_code == 1 and [r.node_rank for r in give_up.failures] == [0]
    # Waited one lease timeout (plus an interval) for a peer loss to explain it:
    assert job.clock.slept == pytest.approx(6.0, abs=0.2)


def test_a_peer_lost_meanwhile_explains_the_failure_and_costs_nothing() -> None:
    job = Job("--max-restarts=0")
    job.keep_renewing(1)  # node 2 is silent: its machine died, which killed our worker
    assert job.policy.after_local_failure(job.generation([exit_record()])) is None
    assert job.rdzv.ledger.lost_nodes(0, 3) == [2]


def test_a_restart_charged_for_a_generation_that_lost_a_node_is_refunded() -> None:
    job = Job("--max-restarts=1")
    first = job.generation([exit_record()])
    assert job.policy.after_local_failure(first) is None and job.policy.budget.exhausted
    smaller = Membership(1, job.membership.members[:2])
    job.policy.settle(first, Generation(smaller, 0, FailedGroup(), job.peers, None, None))  # type: ignore[arg-type]
    assert job.policy.budget.used == 0


def test_watching_the_peers_leases_is_one_request_however_many_peers() -> None:
    job = Job()
    peers = PeerLeases(job.store, job.rdzv.keys, 0, list(range(1, 65)), 5.0, 1.0, job.clock.clock)
    for node in range(1, 65):
        job.renew(node, 1)
    job.store.calls.clear()
    assert peers.stale() == []
    assert job.store.calls == {"multi_get": 1}


def test_in_a_big_job_a_loss_found_by_its_watchers_reaches_every_node() -> None:
    """Node 0 of 12 does not watch node 3; node 2 does. Node 3 stops renewing: node 2
    declares it, and node 0's survivors for the next round leave it out."""
    job = Job()
    members = [MemberInfo(f"id{n}", f"10.0.0.{n}", 1) for n in range(12)]
    membership = Membership(0, members)
    leases = StoreLeases(job.store, lambda: job.store, job.rdzv.keys, 5.0, 1.0, job.clock.clock)
    watch_0, watch_2 = leases.peers(0, 0, 12), leases.peers(0, 2, 12)
    assert 3 not in watch_0.watched and 3 in watch_2.watched
    for node in range(12):
        if node != 3:
            job.keep_renewing(node)
    job.renew(3, 1)
    as_node_2 = FaultPolicy(
        job.rdzv, fault_part(job.spec), "10.0.0.2", lambda: None, job.clock.clock
    )
    alive = job.policy.survivors(Joined(membership, 0, watch_0))
    assert alive is not None
    declared = False
    for _ in range(80):  # 8 s, checked every 0.1 s, as the agents do
        assert not job.policy.check_leases(membership, 0, watch_0)
        declared = declared or as_node_2.check_leases(membership, 2, watch_2)
        job.clock.sleep(0.1)
    assert declared and job.rdzv.ledger.lost_nodes(0, 12) == [3]
    assert alive() == {f"id{n}" for n in range(12) if n != 3}
