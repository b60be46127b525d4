"""A repair that fails twice falls back for the whole job (agent/repair/fallback.py):
the count is the job's, on the rendezvous store (torch's real HashStore here), once per
generation however many nodes failed in it, and every node reads the one record."""

from __future__ import annotations

from rtrain.agent.repair.fallback import FALLBACK_AFTER, Fallback, JobFallback
from rtrain.core.rendezvous.keys import StoreKeys
from tests.unit.agent.fakes import memory_store


def _nodes(count: int) -> list[JobFallback]:
    store, keys = memory_store(), StoreKeys("job")
    return [JobFallback(store, keys) for _ in range(count)]


def test_a_failed_repair_counts_once_for_the_job_however_many_nodes_failed_in_it() -> None:
    a, b, c = _nodes(3)
    assert FALLBACK_AFTER == 2
    assert a.failed(3, node_rank=0) is None  # the job's first failed repair
    assert b.failed(3, node_rank=1) is None  # the same repair, counted already
    assert c.read() is None  # every node still repairs
    written = b.failed(5, node_rank=1)  # the second: node 1 turns it off for all
    assert written == Fallback(5, 1, (3, 5))
    assert a.failed(5, node_rank=0) is None  # counted once; not written twice
    assert a.read() == c.read() == written


def test_failures_on_different_nodes_add_up_job_wide() -> None:
    a, b = _nodes(2)
    assert a.failed(0, node_rank=0) is None
    assert b.read() is None
    assert b.failed(1, node_rank=1) == Fallback(1, 1, (0, 1))  # node 0's first, node 1's
    assert a.read() == Fallback(1, 1, (0, 1))


def test_a_record_rtrain_did_not_write_turns_repair_off_all_the_same() -> None:
    store, keys = memory_store(), StoreKeys("job")
    store.set(keys.repair_fallback, b"\x00garbage")
    assert JobFallback(store, keys).read() == Fallback(0, 0, ())


def test_the_record_is_checked() -> None:
    assert Fallback.decode(Fallback(2, 1, (0, 2)).encode().encode()) == Fallback(2, 1, (0, 2))
    for bad in (
        b"[]",
        b"{}",
        b'{"generation": -1, "node": 0, "failed": []}',
        b'{"generation": 1, "node": true, "failed": []}',
        b'{"generation": 1, "node": 0, "failed": ["1"]}',
        b"x" * (1 << 17),
    ):
        assert Fallback.decode(bad) is None, bad
