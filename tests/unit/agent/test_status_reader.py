"""The status reader over torch's real in-process store: what it reads, that it never
writes, that its requests do not grow with the job, and what it refuses."""

from __future__ import annotations

import pytest

from rtrain.agent.observe.status_reader import CountingStore, NoJob, read_status
from rtrain.agent.rendezvous.ledger import FailureLedger
from rtrain.core.errors import RtrainError
from rtrain.core.observe.status import NodeStatus
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, StoreKeys

from .fakes import memory_store

KEYS = StoreKeys("job")


def running_job(nodes: int, generation: int = 1):
    store = memory_store()
    store.set(KEYS.round, str(generation))
    members = [MemberInfo(f"n{i}", f"10.0.{i // 250}.{i % 250}", 2) for i in range(nodes)]
    store.set(KEYS.closed(generation), Membership(generation, members).encode())
    for i in range(nodes):
        steps = (40 + i, 41) if i else (None, 41)
        record = NodeStatus(1000.0, "running", (2 * i, 2 * i + 1), steps, 40, 39)
        store.set(KEYS.status(generation, i), record.encode())
    return store


def test_a_running_job_with_its_nodes_steps_and_failures() -> None:
    store = running_job(3)
    ledger = FailureLedger(store, KEYS, 0)
    ledger.record_failure(FailureRecord(FailureKind.EXIT, 0, 2, "10.0.0.2", 900.0, 1, 5))
    ledger.mark_lost(1, 2, by_node=0)
    view = read_status(store, "job", now=lambda: 1002.5)
    assert (view.round, view.generation, view.running) == (1, 1, True)
    assert [n.status.steps if n.status else None for n in view.nodes] == [
        (None, 41),
        (41, 41),
        (42, 41),
    ]
    assert [n.age_s for n in view.nodes] == [2.5, 2.5, 2.5]
    assert [n.problem for n in view.nodes] == ["", "", "lost (its lease expired)"]
    assert view.step == 41
    assert [(f.generation, f.kind, f.rank) for f in view.failures] == [(0, "exit", 5)]


def test_its_requests_do_not_grow_with_the_nodes() -> None:
    small = read_status(running_job(2), "job", now=lambda: 1000.0)
    large = read_status(running_job(64), "job", now=lambda: 1000.0)
    assert len(large.nodes) == 64 and all(n.seen for n in large.nodes)
    assert large.reads == small.reads <= 12


def test_a_forming_round_shows_the_joined_and_the_last_generation() -> None:
    store = running_job(2, generation=1)
    store.set(KEYS.round, "2")
    store.add(KEYS.joins(2), 1)
    view = read_status(store, "job", now=lambda: 1000.0)
    assert (view.round, view.generation, view.running, view.joined) == (2, 1, False, 1)
    assert len(view.nodes) == 2


def test_the_reader_never_writes() -> None:
    store = memory_store()
    with pytest.raises(NoJob, match="no job 'job'"):
        read_status(store, "job")
    assert store.get(KEYS.round) is None  # not created, as a joining agent would
    with pytest.raises(AttributeError, match="does not set"):
        CountingStore(store).set("k", "v")


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        (KEYS.round, "soon", "refusing what is under /rtrain/job/round"),
        (KEYS.closed(1), "{garbage", "refusing what is under /rtrain/job/r1/closed"),
    ],
)
def test_garbage_under_the_jobs_keys_is_one_clear_error(key, value, fragment) -> None:
    store = running_job(2)
    store.set(key, value)
    with pytest.raises(RtrainError, match=fragment) as error:
        read_status(store, "job")
    assert error.value.exit_code == 1 and "\n" not in str(error.value)


def test_a_garbage_record_costs_its_node_only() -> None:
    store = running_job(2)
    store.set(KEYS.status(1, 1), b"\xff\x00")
    view = read_status(store, "job", now=lambda: 1000.0)
    assert view.nodes[0].seen and view.nodes[1].problem == "refused: status record: not JSON"
