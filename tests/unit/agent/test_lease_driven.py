"""A lease keeper driven from outside (own_thread=False): what bench_scale.py sim runs
for thousands of agents on one loop. Each renew_once is one renewal, nothing renews
between calls, and a closed keeper or a failed store stops it for good."""

from __future__ import annotations

import threading

from rtrain.agent.rendezvous.lease import StoreLeases
from rtrain.core.rendezvous.protocol import StoreKeys

from .fakes import FaultyStore, memory_store


def test_a_keeper_without_a_thread_renews_only_when_driven() -> None:
    store = memory_store()
    keys = StoreKeys("driven")
    before = threading.active_count()
    leases = StoreLeases(store, lambda: store, keys, 5.0, 1.0, own_thread=False)
    assert threading.active_count() == before  # no thread of its own
    assert leases.keeper.renew_once()  # nothing held yet: no write
    assert store.get(keys.lease(0, 3)) is None
    leases.hold(0, 3)
    assert store.get(keys.lease(0, 3)) is None  # hold alone renews nothing
    assert leases.keeper.renew_once() and leases.keeper.renew_once()
    assert store.get(keys.lease(0, 3)) == b"2"
    leases.close()
    assert not leases.keeper.renew_once()
    assert store.get(keys.lease(0, 3)) == b"2"


def test_a_driven_keeper_stops_when_its_store_fails() -> None:
    faulty = FaultyStore(memory_store())
    keys = StoreKeys("driven-fail")
    leases = StoreLeases(faulty, lambda: faulty, keys, 5.0, 1.0, own_thread=False)
    leases.hold(0, 0)
    assert leases.keeper.renew_once()
    faulty.stop()
    assert not leases.keeper.renew_once()
    assert not leases.keeper.renew_once()  # stays stopped
