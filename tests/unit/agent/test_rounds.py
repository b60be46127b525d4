"""Rounds, the failure ledger and the job-end records, driven in process: torch's real
HashStore behind the typed store, a fake clock, faults from FaultyStore. Other agents
are played by writing what they would write, at the fake time they would write it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rtrain.agent.ending import JobEnd
from rtrain.agent.rendezvous.generation_watch import SWEEP_S, GenerationWatch
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.rendezvous.job_end import JobAborted
from rtrain.core.errors import JobFinished, RendezvousTimeout, RtrainError, StoreUnavailable
from rtrain.core.rendezvous.closing import BACKUP_CLOSE_S, LAST_RESORT_CLOSE_S
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import AbortRecord, MemberInfo, Membership, StoreKeys

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store

FLAGS = ("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")


def member(n: int, addr: str | None = None) -> MemberInfo:
    return MemberInfo(node_id=f"id{n}", addr=addr or f"10.0.0.{n}", local_world_size=2)


def other_joins(store: FaultyStore, keys: StoreKeys, generation: int, who: MemberInfo) -> None:
    """What another agent's join writes: its slot number, then its slot."""
    slot = store.inner.add(keys.joins(generation), 1)
    store.inner.set(keys.slot(generation, slot), who.encode())


@pytest.fixture
def job() -> tuple[JobRendezvous, FaultyStore, FakeClock]:
    clock = FakeClock()
    store = FaultyStore(memory_store())
    return JobRendezvous.over(store, launch_spec(*FLAGS), clock.clock), store, clock


def test_a_round_closes_at_max_nodes_at_once(job) -> None:
    rdzv, store, clock = job
    other_joins(store, rdzv.keys, 0, member(2, "10.0.0.9"))
    membership = rdzv.rounds.join(member(1, "10.0.0.5"))
    assert [m.node_id for m in membership.members] == ["id1", "id2"]  # by address
    assert membership.generation == 0 and clock.slept <= 0.05  # no last call: one poll


def test_a_round_below_max_closes_after_the_last_call(job) -> None:
    rdzv, _, clock = job
    membership = rdzv.rounds.join(member(1))
    assert len(membership.members) == 1
    assert clock.slept == pytest.approx(30.0, abs=0.05)  # last_call_timeout, in fake time


def test_a_late_joiner_is_admitted_before_the_last_call(job) -> None:
    rdzv, store, clock = job
    clock.at(10.0, lambda: other_joins(store, rdzv.keys, 0, member(2)))
    membership = rdzv.rounds.join(member(1))
    assert len(membership.members) == 2 and clock.slept == pytest.approx(10.0, abs=0.05)


def test_too_few_nodes_time_out_with_the_generation_named() -> None:
    clock = FakeClock()
    rdzv = JobRendezvous.over(
        memory_store(),
        launch_spec("--nnodes=2", *FLAGS[1:], "--rdzv-conf=join_timeout=50"),
        clock.clock,
    )
    with pytest.raises(RendezvousTimeout, match="1 of at least 2 nodes") as error:
        rdzv.rounds.join(member(1))
    assert error.value.generation == 0 and clock.slept == pytest.approx(50.0, abs=0.05)


def test_a_garbage_slot_is_left_out_not_trusted(job) -> None:
    rdzv, store, _ = job
    slot = store.inner.add(rdzv.keys.joins(0), 1)
    store.plant(rdzv.keys.slot(0, slot), b"\x80garbage{")
    membership = rdzv.rounds.join(member(1))
    assert [m.node_id for m in membership.members] == ["id1"]


def test_an_excluded_node_is_left_out_and_told_so() -> None:
    clock = FakeClock()
    store = FaultyStore(memory_store())
    spec = launch_spec(*FLAGS, "--max-node-failures=1")
    rdzv = JobRendezvous.over(store, spec, clock.clock)
    flapping = member(2)
    rdzv.ledger.count_node_failure(flapping.addr)
    other_joins(store, rdzv.keys, 0, flapping)
    assert [m.node_id for m in rdzv.rounds.join(member(1)).members] == ["id1"]
    with pytest.raises(RtrainError, match="excluded from the job"):
        rdzv.ledger.raise_if_excluded(flapping.addr)


def test_an_abort_record_ends_a_join(job) -> None:
    rdzv, _, clock = job
    record = AbortRecord(0, 1, "restarts exhausted", 1)
    clock.at(5.0, lambda: rdzv.ends.abort(record))
    with pytest.raises(JobAborted) as error:
        rdzv.rounds.join(member(1))
    assert error.value.record == record


def test_a_forged_abort_record_is_refused(job) -> None:
    rdzv, store, _ = job
    store.plant(rdzv.keys.abort, "{not json")
    with pytest.raises(RtrainError, match="refusing the job's abort key"):
        rdzv.rounds.join(member(1))


def test_a_store_lost_in_the_middle_of_a_join_is_a_tempfail(job) -> None:
    rdzv, store, clock = job
    clock.at(1.0, store.stop)
    with pytest.raises(StoreUnavailable) as error:
        rdzv.rounds.join(member(1))
    assert error.value.exit_code == 75


def test_a_generation_moved_past_fences_its_members(job) -> None:
    rdzv, _, _ = job
    rdzv.rounds.join(member(1))
    assert not rdzv.rounds.round_moved_past(0)
    rdzv.rounds.open_next_round(0)
    rdzv.rounds.open_next_round(0)  # idempotent across agents
    assert rdzv.rounds.round_moved_past(0) and rdzv.rounds.current_round() == 1


def test_the_next_round_keeps_node_ranks_and_takes_the_waiting(job) -> None:
    rdzv, store, _ = job
    first = rdzv.rounds.join(member(1, "10.0.0.9"))
    rdzv.rounds.open_next_round(0)
    other_joins(store, rdzv.keys, 1, member(2, "10.0.0.1"))
    assert rdzv.rounds.waiting_nodes(0) == 1
    again = MemberInfo("id1", "10.0.0.9", 2, prev_rank=first.node_rank_of("id1"))
    second = rdzv.rounds.join(again)
    assert second.generation == 1 and second.node_rank_of("id1") == 0


def test_the_worker_store_address_is_validated(job) -> None:
    rdzv, store, clock = job
    store.plant(rdzv.keys.master(0), '{"host": "", "port": 0}')
    with pytest.raises(RtrainError, match="refusing the worker store address"):
        rdzv.workers.wait(0, 5.0)
    with pytest.raises(RtrainError, match="did not publish"):
        rdzv.workers.wait(1, 5.0)
    assert clock.slept == pytest.approx(5.0, abs=0.05)


def record(node: int, when: float, kind: str = "exit", host: str = "h") -> FailureRecord:
    return FailureRecord(kind=kind, generation=0, node_rank=node, host=host, time=when, rank=node)


def test_the_ledger_keeps_records_and_refuses_forged_ones(job) -> None:
    rdzv, store, _ = job
    rdzv.ledger.record_failure(record(0, 2.0))
    rdzv.ledger.record_failure(record(1, 1.0))
    store.plant(rdzv.keys.failure_count(0, 1), "2")
    store.plant(rdzv.keys.failure(0, 1, 2), '{"kind": "rm -rf"}')
    found = rdzv.ledger.failures(0, 2)
    assert sorted(r.time for r in found) == [1.0, 2.0]
    assert all(r.kind == FailureKind.EXIT for r in found)


def test_only_the_first_reporter_claims_the_restart_and_the_first_declarer_the_loss(job) -> None:
    rdzv, _, _ = job
    assert rdzv.ledger.claim_restart(3) and not rdzv.ledger.claim_restart(3)
    assert rdzv.ledger.mark_lost(3, 1, by_node=0) and not rdzv.ledger.mark_lost(3, 1, by_node=2)
    assert rdzv.ledger.lost_nodes(3, 3) == [1]


def test_the_lost_nodes_of_a_big_job_are_one_request_while_none_is_lost(job) -> None:
    rdzv, store, _ = job
    store.calls.clear()
    assert rdzv.ledger.lost_nodes(0, 2048) == []
    assert sum(store.calls.values()) == 1
    rdzv.ledger.mark_lost(0, 1500, by_node=7)
    store.calls.clear()
    assert rdzv.ledger.lost_nodes(0, 2048) == [1500]
    assert sum(store.calls.values()) == 1  # the entry, once read, is kept


def test_a_loss_whose_first_declarer_died_before_listing_it_is_listed_by_the_next(job) -> None:
    rdzv, store, _ = job
    store.plant(rdzv.keys.lost(2, 4), "0")  # node 0 marked it, then died
    assert not rdzv.ledger.mark_lost(2, 4, by_node=1)
    assert rdzv.ledger.lost_nodes(2, 8) == [4]


def test_garbage_in_the_lost_list_is_refused(job, caplog) -> None:
    rdzv, store, _ = job
    store.plant(rdzv.keys.lost_count(1), "2")
    store.plant(rdzv.keys.lost_entry(1, 1), "rm -rf")
    store.plant(rdzv.keys.lost_entry(1, 2), "9")  # not a node of a 4-node job
    assert rdzv.ledger.lost_nodes(1, 4) == []
    assert "refusing entry of the lost-node list" in caplog.text
    store.plant(rdzv.keys.lost_count(1), "many")
    with pytest.raises(RtrainError, match="refusing the job's state"):
        rdzv.ledger.lost_nodes(1, 4)


def test_the_root_cause_is_charged_once_however_many_close(job) -> None:
    rdzv, _, _ = job
    rdzv.ledger.record_failure(record(0, 5.0, host="victim"))
    rdzv.ledger.record_failure(record(1, 1.0, host="culprit"))
    for closer in ("a", "b", "c", "a"):  # "a" again: rewriting its charge is no new one
        rdzv.ledger.charge_root_cause(0, 3, closer)
    assert rdzv.ledger.node_failures("culprit") == 1
    assert rdzv.ledger.node_failures("victim") == 0


def test_the_exit_barrier_waits_for_every_node_or_yields_to_a_new_generation(job) -> None:
    rdzv, _, clock = job
    membership = Membership(0, [member(1), member(2)])
    end = JobEnd(
        rdzv, is_host=False, close_timeout=5.0, check_signal=lambda: None, clock=clock.clock
    )
    clock.at(3.0, lambda: rdzv.ends.mark_done(0))
    assert end.exit_barrier(membership) and rdzv.ends.exited_count(0) == 1
    rdzv.rounds.open_next_round(0)  # generation 1 runs; another node restarts it meanwhile
    clock.at(2.0, lambda: rdzv.rounds.open_next_round(1))
    assert not end.exit_barrier(Membership(1, [member(1), member(2)]))


class _Expires:
    """A lease watch in which node `node`'s lease expires at `at` (fake-clock seconds)."""

    generation, timeout = 0, 5.0

    def __init__(self, clock: FakeClock, node: int, at: float) -> None:
        self._clock, self._node, self._at = clock, node, at

    def stale(self) -> list[int]:
        return [self._node] if self._clock.clock.now() >= self._at else []

    def forget(self, node: int) -> None:
        pass

    def last_seen(self, node: int) -> float | None:
        return None


def test_a_node_lost_at_the_exit_barrier_is_not_waited_for_and_a_returner_finds_the_end(
    job,
) -> None:
    """Node 2 of 3 stops after its workers' last collective: the barrier used to wait for
    it without end. Node 0 watches its lease and marks it lost; node 1, which does not
    watch it, reads the mark; both pass, and node 2, back, finds the job finished."""
    rdzv, _, clock = job
    membership = Membership(0, [member(1), member(2), member(3)])
    end = JobEnd(
        rdzv, is_host=False, close_timeout=5.0, check_signal=lambda: None, clock=clock.clock
    )
    rdzv.ends.mark_done(0)  # node 1 is done, and waits too
    assert end.exit_barrier(membership, _Expires(clock, 2, at=4.0), me=0)
    assert rdzv.ledger.lost_nodes(0, 3) == [2]
    assert rdzv.rounds.round_moved_past(0) is False  # no generation to redo finished work
    assert end.exit_barrier(membership, _Expires(clock, 2, at=1e9), me=1)  # by the mark
    with pytest.raises(JobFinished):
        rdzv.rounds._raise_if_finished(0, size=3)


def test_lost_nodes_alone_are_no_finished_job(job) -> None:
    """A partition: each of two nodes declares the other lost; nobody passed the exit
    barrier, so a node waiting for the next round must not take the job as finished."""
    rdzv, _, _ = job
    rdzv.rounds.current_round()
    rdzv.ledger.mark_lost(0, 0, 1)
    rdzv.ledger.mark_lost(0, 1, 0)
    assert rdzv.ledger.lost_nodes(0, 2) == [0, 1]  # every node of the generation is lost
    assert rdzv.ends.exited_count(0) == 0
    assert rdzv.rounds._raise_if_finished(0, size=2) is None  # no exit: not finished
    rdzv.ends.mark_exited(0)  # one exit is the proof the job ended
    with pytest.raises(JobFinished):
        rdzv.rounds._raise_if_finished(0, size=2)


def test_the_first_abort_wins_and_the_others_acknowledge(job) -> None:
    rdzv, _, _ = job
    assert rdzv.ends.abort(AbortRecord(0, 0, "first", 1))
    assert not rdzv.ends.abort(AbortRecord(0, 1, "second", 76))
    assert rdzv.ends.read_abort() == AbortRecord(0, 0, "first", 1)


def test_a_waiting_round_costs_each_agent_o1_requests_a_second() -> None:
    # 63 others joined a round of up to 128; this node, slot 64, waits for slot 1 to
    # close it. Before: every agent read all 64 slots and three counters every 20 ms.
    clock = FakeClock()
    store = FaultyStore(memory_store())
    flags = ("--nnodes=2:128", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags), clock.clock)
    for n in range(63):
        other_joins(store, rdzv.keys, 0, member(100 + n))
    # one survivor has not joined yet, so no rule lets this node close the round
    survivors = {f"id{100 + n}" for n in range(63)} | {"id1", "id999"}

    def slot_1_closes() -> None:
        rdzv.rounds._try_close(0, 64, "id100")

    clock.at(10.0, slot_1_closes)
    membership = rdzv.rounds.join(member(1), expected=lambda: survivors)
    assert len(membership.members) == 64 and clock.slept == pytest.approx(10.0, abs=0.2)
    requests = sum(store.calls.values())
    assert requests / 10.0 < 60, store.calls  # was 214 a second (all 64 slots each pass)
    # the slots were read once each, in one request per backup check at most
    assert store.calls["multi_get"] <= 11


def _waiting_follower(clock: FakeClock) -> tuple[JobRendezvous, set[str]]:
    """63 others in a round of up to 128; this node (id1) joins as slot 64, a follower;
    every expected survivor is in once it has joined: the round is closable at once."""
    store = FaultyStore(memory_store())
    flags = ("--nnodes=2:128", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags), clock.clock)
    for n in range(63):
        other_joins(store, rdzv.keys, 0, member(100 + n))
    return rdzv, {f"id{100 + n}" for n in range(63)} | {"id1"}


def test_a_late_follower_closes_a_round_slot_1_left_closable_as_a_last_resort() -> None:
    clock = FakeClock()
    rdzv, survivors = _waiting_follower(clock)  # slots 1-4 died after joining
    membership = rdzv.rounds.join(member(1), expected=lambda: survivors)
    assert len(membership.members) == 64
    assert clock.slept == pytest.approx(BACKUP_CLOSE_S + LAST_RESORT_CLOSE_S, abs=0.3)


def test_slot_2_closes_a_round_slot_1_left_closable_one_check_later() -> None:
    clock = FakeClock()
    store = FaultyStore(memory_store())
    flags = ("--nnodes=2:128", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags), clock.clock)
    other_joins(store, rdzv.keys, 0, member(100))  # slot 1, then it died
    membership = rdzv.rounds.join(member(1), expected=lambda: {"id100", "id1"})
    assert len(membership.members) == 2
    assert clock.slept == pytest.approx(2 * BACKUP_CLOSE_S, abs=0.3)


def test_a_follower_leaves_the_closing_to_slot_1_while_it_lives() -> None:
    clock = FakeClock()
    rdzv, survivors = _waiting_follower(clock)
    tries: list[str] = []
    close = rdzv.rounds._try_close

    def recorded(target: int, size: int, closer: str) -> None:
        tries.append(closer)
        close(target, size, closer)

    rdzv.rounds._try_close = recorded  # type: ignore[method-assign]
    clock.at(1.5, lambda: recorded(0, 64, "id100"))  # slot 1 closes between two checks
    membership = rdzv.rounds.join(member(1), expected=lambda: survivors)
    assert len(membership.members) == 64 and tries == ["id100"]


def test_the_abort_record_and_the_nodes_waiting_are_read_once_a_second(job) -> None:
    rdzv, store, clock = job
    store.calls.clear()
    for _ in range(50):  # 50 passes of a 20 ms loop: one second
        rdzv.ends.raise_if_aborted()
        assert rdzv.rounds.waiting_nodes(0) == 0
        clock.sleep(0.02)
    assert sum(store.calls.values()) == 2, store.calls
    other_joins(store, rdzv.keys, 1, member(3))  # a node waits; the abort comes
    rdzv.ends.abort(AbortRecord(0, 1, "restarts exhausted", 1))
    clock.sleep(0.02)
    assert rdzv.rounds.waiting_nodes(0) == 1
    with pytest.raises(JobAborted):
        rdzv.ends.raise_if_aborted()


def test_a_healthy_big_job_reads_its_failures_and_exclusions_in_one_request_each() -> None:
    clock = FakeClock()
    store = FaultyStore(memory_store())
    flags = ("--nnodes=2:2048", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags, "--max-node-failures=2"), clock.clock)
    addrs = [f"10.0.{n >> 8}.{n & 255}" for n in range(2048)]
    store.calls.clear()
    assert rdzv.ledger.failures(0, 2048) == [] and rdzv.ledger.excluded(addrs) == set()
    assert sum(store.calls.values()) == 2, store.calls
    rdzv.ledger.count_node_failure(addrs[7])
    rdzv.ledger.count_node_failure(addrs[7])
    rdzv.ledger.count_node_failure(addrs[9])
    rdzv.ledger.record_failure(record(1500, 3.0))
    store.calls.clear()
    assert rdzv.ledger.excluded(addrs) == {addrs[7]}
    assert [r.node_rank for r in rdzv.ledger.failures(0, 2048)] == [1500]
    assert sum(store.calls.values()) <= 2 + 3, store.calls  # entries kept once read


def test_every_change_a_running_generation_must_see_sets_its_news(job) -> None:
    rdzv, store, _ = job
    other_joins(store, rdzv.keys, 0, member(2))
    rdzv.rounds.join(member(1))  # generation 0, at max_nodes=2
    news0 = rdzv.rounds.news(0)
    assert not news0()
    rdzv.rounds.open_next_round(0)
    assert news0() and store.inner.get(rdzv.keys.news(0)) == b"round"
    # an abort wakes the generation it names
    news1 = rdzv.rounds.news(1)
    rdzv.ends.abort(AbortRecord(1, 0, "layout", 65))
    assert news1() and store.inner.get(rdzv.keys.news(1)) == b"abort"


@pytest.mark.parametrize(("max_nodes", "news"), [(3, b"waiting"), (2, None)])
def test_a_waiting_node_wakes_only_a_generation_with_room_for_it(
    max_nodes: int, news: bytes | None
) -> None:
    # generation 0 runs with 2 nodes; a third joins and waits for round 1. With
    # max_nodes=2 it is a hot spare: the running nodes could not admit it anyway.
    clock = FakeClock()
    store = FaultyStore(memory_store())
    flags = (f"--nnodes=1:{max_nodes}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags), clock.clock)
    other_joins(store, rdzv.keys, 0, member(2))
    other_joins(store, rdzv.keys, 0, member(3))
    rdzv.rounds._try_close(0, 2, "id2")
    said: list[bytes | None] = []

    def next_round() -> None:  # generation 0's nodes admit it: a round of its own
        said.append(store.inner.get(rdzv.keys.news(0)))
        rdzv.rounds.open_next_round(0)
        rdzv.rounds._try_close(1, 1, "id1")

    clock.at(1.0, next_round)
    membership = rdzv.rounds.join(member(1))
    assert membership.generation == 1 and clock.slept < 10.0
    assert said == [news]


def test_a_running_generation_reads_the_round_only_on_news_or_a_sweep(job) -> None:
    rdzv, store, clock = job
    other_joins(store, rdzv.keys, 0, member(2))
    rdzv.rounds.join(member(1))
    watch = GenerationWatch(rdzv.rounds, rdzv.ends, 0, room_to_grow=False, clock=clock.clock)
    assert watch.due() and not watch.fenced()  # the first pass sweeps
    store.calls.clear()
    looks = 0
    for _ in range(int(SWEEP_S / 0.25) - 1):  # a healthy generation, just under a sweep
        clock.sleep(0.25)
        looks += watch.due()
    assert looks == 0 and set(store.calls) == {"notice"}  # the news key only (a wait on TCPStore)
    clock.sleep(0.25)
    assert watch.due() and not watch.due()  # the sweep, once
    assert watch.due(force=True)  # a local failure looks at once
    rdzv.rounds.open_next_round(0)  # another node ended the generation
    assert watch.due() and watch.fenced()


def test_an_abort_reaches_a_running_generation_through_its_news(job) -> None:
    rdzv, store, clock = job
    other_joins(store, rdzv.keys, 0, member(2))
    rdzv.rounds.join(member(1))
    watch = GenerationWatch(rdzv.rounds, rdzv.ends, 0, room_to_grow=True, clock=clock.clock)
    assert watch.due() and not watch.admits_waiting()
    clock.sleep(1.0)
    assert not watch.due()
    rdzv.ends.abort(AbortRecord(0, 1, "layout", 65))
    assert watch.due()
    with pytest.raises(JobAborted):
        watch.admits_waiting()


def test_a_long_rendezvous_says_how_far_it_is_and_whom_it_waits_for(caplog) -> None:
    clock = FakeClock()
    spec = launch_spec("--nnodes=3", *FLAGS[1:], "--rdzv-conf=join_timeout=30")
    rdzv = JobRendezvous.over(FaultyStore(memory_store()), spec, clock.clock)
    clock.at(12.0, lambda: other_joins(rdzv.store, rdzv.keys, 0, member(2)))
    clock.at(14.0, lambda: other_joins(rdzv.store, rdzv.keys, 0, member(3)))
    with caplog.at_level("INFO", logger="rtrain.agent.rendezvous.rounds"):
        rdzv.rounds.join(member(1))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rendezvous:")]
    # nothing in the first 2 s, then one line every 5 s, and how it ended
    assert lines == [
        "rendezvous: 1 of 3 nodes joined round 0 (2s so far)",
        "rendezvous: 1 of 3 nodes joined round 0 (7s so far)",
        "rendezvous: 2 of 3 nodes joined round 0 (12s so far)",
        "rendezvous: round 0 closed with 3 nodes (after 14.0s)",
    ]

    # the next round: the first joiner names the survivors it still waits for
    caplog.clear()
    rdzv.rounds.open_next_round(0)
    clock.at(clock.time + 9.0, lambda: other_joins(rdzv.store, rdzv.keys, 1, member(3)))
    with (
        caplog.at_level("INFO", logger="rtrain.agent.rendezvous.rounds"),
        pytest.raises(RendezvousTimeout),
    ):
        rdzv.rounds.join(member(1), expected=lambda: {"id1", "id3"}, last_seen={"id3": 2.125}.get)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rendezvous:")]
    waiting = "waiting for id3 (last seen 2.1 s ago)"
    assert lines[0] == f"rendezvous: 1 of 3 nodes joined round 1, {waiting} (2s so far)"


class WokenStore(FaultyStore):
    """notice() answers yes for every key: what a wait woken by a compare-set that wrote
    nothing told the agents (`rtrain status` reading an open round, issue 32)."""

    def notice(self, key: str) -> Callable[[], bool]:
        return lambda: True


def test_a_closed_flag_without_a_membership_means_not_yet() -> None:
    clock = FakeClock()
    store = WokenStore(memory_store())
    rdzv = JobRendezvous.over(store, launch_spec(*FLAGS), clock.clock)
    clock.at(10.0, lambda: other_joins(store, rdzv.keys, 0, member(2)))
    membership = rdzv.rounds.join(member(1))  # not "generation 0 has no membership"
    assert [m.node_id for m in membership.members] == ["id1", "id2"]
    assert clock.slept == pytest.approx(10.0, abs=0.05)
