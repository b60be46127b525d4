"""Who is charged a failure toward --max-node-failures, and how often (issue 32, item 2):
a loss once, to the lost node; a victim never; one charge per generation, however many
times and by whomever it is written; a round that cannot close says whom it left out
and why. In process: FaultPolicy, the ledger and Rounds over torch's real HashStore,
a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rtrain.agent.faults import FaultPolicy
from rtrain.agent.observe.events import EVENTS
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.rendezvous.lease import PeerLeases
from rtrain.core.config.component_specs import fault_part
from rtrain.core.errors import RendezvousTimeout
from rtrain.core.observe.events import Event
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import MemberInfo, Membership

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store

FLAGS = ("--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--max-node-failures=1")
VICTIM = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"


@pytest.fixture
def charges() -> Iterator[list[Event]]:
    """The charge events this process emits."""
    seen: list[Event] = []
    EVENTS.listen(lambda e: seen.append(e) if e.name == "charge" else None)
    try:
        yield seen
    finally:
        EVENTS.close()


def node(n: int) -> MemberInfo:
    return MemberInfo(node_id=f"id{n}", addr=f"10.0.0.{n}", local_world_size=2)


def victim(n: int, when: float) -> FailureRecord:
    return FailureRecord(
        kind=FailureKind.EXIT,
        generation=0,
        node_rank=n,
        host=f"10.0.0.{n}",
        time=when,
        rank=2 * n,
        exitcode=1,
        message=VICTIM,
    )


class Job:
    """Node 0's view of a 3-node job (2:3 nodes, --max-node-failures=1) in generation 0."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FaultyStore(memory_store())
        spec = launch_spec("--nnodes=2:3", *FLAGS, "--rdzv-conf=join_timeout=60")
        self.rdzv = JobRendezvous.over(self.store, spec, self.clock.clock)
        self.keys = self.rdzv.keys
        self.membership = Membership(0, [node(n) for n in range(3)])
        self.rdzv.rounds.current_round()
        self.store.inner.set(self.keys.closed(0), self.membership.encode())
        self.policy = FaultPolicy(
            self.rdzv, fault_part(spec), "10.0.0.0", lambda: None, self.clock.clock
        )
        self.peers = PeerLeases(self.store, self.keys, 0, [1, 2], 2.0, 0.5, clock=self.clock.clock)

    def charged(self) -> list[int]:
        return [self.rdzv.ledger.node_failures(f"10.0.0.{n}") for n in range(3)]

    def joins(self, generation: int, who: MemberInfo) -> None:
        """What another agent's join writes."""
        slot = self.store.inner.add(self.keys.joins(generation), 1)
        self.store.inner.set(self.keys.slot(generation, slot), who.encode())


def test_a_killed_node_is_charged_its_loss_once_and_its_victims_never(charges) -> None:
    """The audit: node 2 SIGKILLed; the survivors' ranks failed first ("Connection closed
    by peer"), node 0's earliest. Before: the closer charged node 0 (the store host) for
    its victim, excluded it, and charged it again on every close attempt; the round
    never closed (one node left of at least 2)."""
    job = Job()
    job.rdzv.ledger.record_failure(victim(0, 1.0))  # this node's, and node 1's
    job.rdzv.ledger.record_failure(victim(1, 1.1))
    beats = iter(range(1, 1000))
    for _ in range(12):  # node 1 renews; node 2's lease lapses after 2 s
        job.store.inner.set(job.keys.lease(0, 1), str(next(beats)))
        job.store.inner.set(job.keys.lease(0, 2), "1")
        job.policy.check_leases(job.membership, 0, job.peers)
        job.clock.sleep(0.5)
    assert job.rdzv.ledger.lost_nodes(0, 3) == [2]
    job.joins(1, node(1))
    joined = job.rdzv.rounds.join(node(0), expected=lambda: {"id0", "id1"})
    assert [m.node_id for m in joined.members] == ["id0", "id1"]
    assert job.charged() == [0, 0, 1]
    assert [(e["host"], e["why"], e["from_generation"], e["failures"]) for e in charges] == [
        ("10.0.0.2", "lost", 0, 1)
    ]
    # every closer of the round, and each again, charges nothing more
    for closer in ("id0", "id1", "id0"):
        job.rdzv.ledger.charge_root_cause(0, 3, closer)
    assert job.charged() == [0, 0, 1] and len(charges) == 1


def test_a_charge_rewritten_by_its_own_caller_is_not_a_new_one(charges) -> None:
    job = Job()
    ledger = job.rdzv.ledger
    assert ledger.charge(3, "10.0.0.2", "lost")
    assert not ledger.charge(3, "10.0.0.2", "lost")  # the same caller, the same value
    assert not ledger.charge(3, "10.0.0.2", "root cause")
    assert ledger.node_failures("10.0.0.2") == 1
    # the same declarer declaring twice is no second first declaration either
    assert ledger.mark_lost(3, 2, by_node=0) and not ledger.mark_lost(3, 2, by_node=0)
    # a root cause, charged by one closer over and over, and by others: once
    for n in (0, 1):
        failure = FailureRecord(FailureKind.SIGNAL, 4, n, f"10.0.0.{n}", 5.0 - n, rank=n)
        ledger.record_failure(failure)
    for closer in ("id0",) * 50 + ("id1", "id2"):
        ledger.charge_root_cause(4, 3, closer)
    assert ledger.node_failures("10.0.0.1") == 1 and ledger.node_failures("10.0.0.0") == 0
    assert [(e["host"], e["why"]) for e in charges] == [
        ("10.0.0.2", "lost"),
        ("10.0.0.1", "root cause"),
    ]


def test_a_round_that_cannot_close_names_whom_it_left_out_and_why(caplog) -> None:
    """Its closer tries every 20 ms for join_timeout: the exclusion is said once (not
    4,595 times), and the timeout names it."""
    job = Job()
    job.rdzv.rounds.open_next_round(0)
    assert job.rdzv.ledger.charge(0, "10.0.0.1", "root cause")
    job.joins(1, node(1))
    with pytest.raises(RendezvousTimeout) as error:
        job.rdzv.rounds.join(node(0))
    message = str(error.value)
    assert message.startswith("rendezvous timed out: 2 of at least 2 nodes joined generation 1")
    assert (
        "1 could close it, 1 left out: 10.0.0.1 (excluded from the job: charged 1 failure(s) "
        "(root cause in generation 0), --max-node-failures=1)"
    ) in message, message
    assert error.value.exit_code == 75
    said = [r for r in caplog.records if r.getMessage().startswith("leaving 10.0.0.1 out")]
    assert len(said) == 1, said


def test_a_node_left_behind_declares_none_of_the_peers_that_went_on(charges) -> None:
    """Node 2 stopped (SIGSTOP) past its lease: declared lost, charged once; nodes 0 and
    1 went on in generation 1. Let go on, node 2 finds their generation-0 leases old
    (they renew generation 1's now) while it rejoins. Before: it declared both lost in
    generation 0 and charged each (found on a loaded machine in test_recovery's
    stopped-agent job), enough to exclude both at --max-node-failures=1."""
    job = Job()
    assert job.rdzv.ledger.mark_lost(0, 2, by_node=0)
    assert job.rdzv.ledger.charge(0, "10.0.0.2", "lost")
    job.rdzv.rounds.open_next_round(0)
    job.store.inner.set(job.keys.closed(1), Membership(1, [node(0), node(1)]).encode())
    left_behind = PeerLeases(job.store, job.keys, 0, [0, 1], 2.0, 0.5, clock=job.clock.clock)
    job.store.inner.set(job.keys.lease(0, 0), "7")
    job.store.inner.set(job.keys.lease(0, 1), "7")
    ended = False
    for _ in range(12):
        ended = job.policy.check_leases(job.membership, 2, left_behind) or ended
        job.clock.sleep(0.5)
    assert ended  # its generation is over: it rejoins
    assert job.rdzv.ledger.lost_nodes(0, 3) == [2]
    assert job.charged() == [0, 0, 1] and [e["host"] for e in charges] == ["10.0.0.2"]
