"""Hot spares: nodes beyond max_nodes that joined the next round while a full generation
runs. A spare must cost the store no more than a running node (it waits on the running
generation's news key, as the running nodes do), and when a node is lost the round
takes the survivors and then the first spares, read in a bounded number of calls."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from rtrain.agent.rendezvous.generation_watch import GenerationWatch
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.core.errors import JobFinished
from rtrain.core.rendezvous.protocol import MemberInfo, StoreKeys

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store

MINUTE = 60.0
FLAGS = ("--nnodes=1:4", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")


def member(n: int, prev_rank: int | None = None) -> MemberInfo:
    return MemberInfo(
        node_id=f"id{n:04d}",
        addr=f"10.0.{n >> 8}.{n & 255}",
        local_world_size=1,
        prev_rank=prev_rank,
    )


def other_joins(store: FaultyStore, keys: StoreKeys, generation: int, who: MemberInfo) -> None:
    slot = store.inner.add(keys.joins(generation), 1)
    store.inner.set(keys.slot(generation, slot), who.encode())


def full_job(active: int, spares: int) -> tuple[JobRendezvous, FaultyStore, FakeClock]:
    """Generation 0 closed with `active` nodes at max_nodes; the node under test joins
    round 1 as its first spare and spares - 1 others (2 .. spares) right after it."""
    clock = FakeClock()
    store = FaultyStore(memory_store())
    flags = (f"--nnodes=1:{active}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
    rdzv = JobRendezvous.over(store, launch_spec(*flags), clock.clock)
    assert rdzv.rounds.current_round() == 0  # created, as every agent's first join does
    for n in range(1000, 1000 + active):
        other_joins(store, rdzv.keys, 0, member(n))
    rdzv.rounds._try_close(0, active, "id1000")

    def other_spares() -> None:
        for n in range(2, spares + 1):
            other_joins(store, rdzv.keys, 1, member(n))

    clock.at(0.1, other_spares)
    return rdzv, store, clock


def survivors_rejoin(rdzv: JobRendezvous, store: FaultyStore, active: int) -> None:
    """Node rank active-1 was lost: the others open round 1 and join it."""
    rdzv.rounds.open_next_round(0)
    membership = rdzv.rounds.read_membership(0)
    for rank, m in enumerate(membership.members[:-1]):
        other_joins(store, rdzv.keys, 1, dataclasses.replace(m, prev_rank=rank))


def requests(calls: Counter[str]) -> int:
    """Store requests: a notice check is a blocking wait's answer on TCPStore and a
    watch on etcd, no request while its key stays unset."""
    return sum(n for op, n in calls.items() if op != "notice")


def test_a_spare_costs_no_more_than_a_running_node() -> None:
    rdzv, store, clock = full_job(4, 1)
    seen: list[Counter[str]] = []

    def a_minute_later() -> None:
        seen.append(Counter(store.calls))
        survivors_rejoin(rdzv, store, 4)

    clock.at(MINUTE, a_minute_later)
    store.calls.clear()
    membership = rdzv.rounds.join(member(1))  # the spare
    assert membership.generation == 1 and membership.node_rank_of("id0001") is not None
    spare = seen[0]
    # a running node over the same minute: its generation's watch, every STORE_CHECK_S
    running, _, watch_clock = full_job(4, 1)
    watch = GenerationWatch(running.rounds, running.ends, 0, False, watch_clock.clock)
    running_store = running.store
    assert isinstance(running_store, FaultyStore)
    running_store.calls.clear()
    while watch_clock.slept < MINUTE:
        if watch.due():
            watch.fenced()
            watch.admits_waiting()
        watch_clock.sleep(0.25)
    # and renews its lease every heartbeat (its peers' leases not counted)
    renewals = MINUTE / launch_spec(*FLAGS).faults.heartbeat_interval
    active = running_store.calls
    assert requests(spare) <= requests(active) + renewals, (spare, active)
    assert spare["notice"] <= active["notice"] + 8, (spare, active)
    assert spare["get"] + spare["multi_get"] <= active["get"] + 2, (spare, active)


def test_a_spare_waits_without_reading_the_membership() -> None:
    # the running generation's membership is the largest value in the store: a spare
    # reads it at most once, not on every pass
    rdzv, store, clock = full_job(64, 1)
    gets: list[int] = []
    clock.at(MINUTE, lambda: (gets.append(store.calls["get"]), survivors_rejoin(rdzv, store, 64)))
    store.calls.clear()
    rdzv.rounds.join(member(1))
    assert gets[0] <= 2, store.calls


def lose_a_node_with_spares(spares: int) -> Counter[str]:
    """8 nodes run, spares wait, node rank 7 is lost: the store calls of the round."""
    rdzv, store, clock = full_job(8, spares)
    clock.at(1.0, lambda: survivors_rejoin(rdzv, store, 8))
    store.calls.clear()
    membership = rdzv.rounds.join(member(1))  # slot 1: the first spare
    ids = [m.node_id for m in membership.members]
    # every survivor keeps its place, and the one free place is the first spare's
    assert sorted(ids) == sorted(["id0001", *(f"id{n}" for n in range(1000, 1007))])
    assert membership.node_rank_of("id0001") == 7
    return store.calls


def test_the_lost_nodes_place_goes_to_the_first_spare_in_bounded_calls() -> None:
    few, many = lose_a_node_with_spares(2), lose_a_node_with_spares(200)
    # the slots read in one request, the same calls with 2 spares as with 200
    assert few["multi_get"] == many["multi_get"] == 1, (few, many)
    assert requests(few) == requests(many), (few, many)


def test_a_spare_learns_the_job_finished() -> None:
    rdzv, _, clock = full_job(4, 1)

    def every_node_exits() -> None:
        for _ in range(4):
            rdzv.ends.mark_exited(0)

    clock.at(MINUTE, every_node_exits)
    with pytest.raises(JobFinished):
        rdzv.rounds.join(member(1))
    assert clock.slept <= MINUTE + 10.0


def test_a_survivor_closes_with_the_survivors_first_not_the_spares() -> None:
    # generation 0 ran 4 nodes, rank 3 was lost; 3 spares hold round 1's first slots.
    # The node under test (rank 2) fills the round, but rank 1 is still on its way.
    rdzv, store, clock = full_job(4, 0)
    for n in range(2, 5):
        other_joins(store, rdzv.keys, 1, member(n))
    rdzv.rounds.open_next_round(0)
    ran = rdzv.rounds.read_membership(0).members
    other_joins(store, rdzv.keys, 1, dataclasses.replace(ran[0], prev_rank=0))
    clock.at(
        3.0, lambda: other_joins(store, rdzv.keys, 1, dataclasses.replace(ran[1], prev_rank=1))
    )
    alive = {m.node_id for m in ran[:3]}
    membership = rdzv.rounds.join(dataclasses.replace(ran[2], prev_rank=2), expected=lambda: alive)
    assert {m.node_id for m in membership.members} == alive | {"id0002"}
    assert [membership.node_rank_of(m.node_id) for m in ran[:3]] == [0, 1, 2]
    assert clock.slept == pytest.approx(3.0, abs=0.1)


def test_a_spare_from_an_older_generation_does_not_displace_a_survivor() -> None:
    # generation 0's 4 nodes all rejoin round 1 (a worker failed; nobody was lost); the
    # spare in slot 1 ran in an older generation and still says so (a prev_rank)
    rdzv, store, _ = full_job(4, 0)
    other_joins(store, rdzv.keys, 1, member(2, prev_rank=3))
    rdzv.rounds.open_next_round(0)
    ran = rdzv.rounds.read_membership(0).members
    for rank in range(3):
        other_joins(store, rdzv.keys, 1, dataclasses.replace(ran[rank], prev_rank=rank))
    alive = {m.node_id for m in ran}
    membership = rdzv.rounds.join(dataclasses.replace(ran[3], prev_rank=3), expected=lambda: alive)
    assert {m.node_id for m in membership.members} == alive
