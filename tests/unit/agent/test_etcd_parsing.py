"""What the etcd client makes of answers that are not what etcd sends: every answer
comes over the network, so a malformed one is a RendezvousError (NotEtcd), never an
exception of another kind and never trusted; and how peers' leases are judged from
what a watch holds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.agent.rendezvous.etcd_leases import EtcdPeerLeases
from rtrain.agent.store.etcd import store as etcd_store
from rtrain.agent.store.etcd.watch import KeyWatch
from rtrain.agent.store.etcd.wire import NotEtcd, int_field, prefix_end, revision
from rtrain.core.errors import RendezvousError
from rtrain.core.rendezvous.protocol import StoreKeys

from .fakes import FakeClock

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
answers = st.dictionaries(
    st.sampled_from(["kvs", "responses", "header", "count", "events", "x"]), json_values, max_size=4
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(answers)
def test_a_malformed_range_or_txn_answer_is_refused(answer: dict[str, Any]) -> None:
    """Each read gives a value of its own type or refuses (RendezvousError); an
    exception of any other type fails."""
    reads: list[tuple[Callable[[], object], type | tuple[type, ...]]] = [
        (lambda: etcd_store._first_value(answer), (bytes, type(None))),
        (lambda: etcd_store._response(answer, 0, "response_range"), dict),
        (lambda: revision(answer), int),
    ]
    for read, kind in reads:
        try:
            value = read()
        except RendezvousError:
            continue
        assert isinstance(value, kind), value


class _Watch(KeyWatch):
    """A KeyWatch without a server: only its event parsing."""

    def __init__(self) -> None:
        self.key = "/k"
        self._values = {}
        self._revision = 0
        import threading

        self._changed = threading.Condition()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(json_values)
def test_malformed_watch_events_are_refused(events: object) -> None:
    watch = _Watch()
    with contextlib.suppress(RendezvousError):
        watch._apply(events)
    assert all(isinstance(v, bytes) for v in watch.items().values())


def test_watch_events_put_and_delete_keys() -> None:
    watch = _Watch()
    put = {"kv": {"key": "L2E=", "value": "MQ==", "mod_revision": "7"}}
    watch._apply([put])
    assert watch.value("/a") == b"1" and watch._revision == 7
    watch._apply([{"type": "DELETE", "kv": {"key": "L2E=", "mod_revision": "9"}}])
    assert watch.value("/a") is None and watch._revision == 9
    with pytest.raises(NotEtcd):
        watch._apply([{"kv": {"key": "not base64!"}}])


def test_int_fields_and_prefix_ends() -> None:
    assert int_field({"TTL": "5"}, "TTL") == 5 and int_field({}, "TTL") == 0
    with pytest.raises(NotEtcd):
        int_field({"TTL": "five"}, "TTL")
    assert prefix_end(b"/r0/lease/") == b"/r0/lease0"
    assert prefix_end(b"a\xff") == b"b" and prefix_end(b"\xff") == b"\0"


def test_peer_leases_are_lost_when_etcd_deletes_their_key_or_they_never_come() -> None:
    keys = StoreKeys("job")
    watch = _Watch()
    clock = FakeClock(0.0)
    peers = EtcdPeerLeases(watch.items, keys, 3, [1, 2, 4], timeout=2.0, clock=clock.clock)
    watch._values = {keys.lease(3, 1): b"x", keys.lease(3, 2): b"y"}
    assert peers.stale() == []  # 4 has not written yet, within the timeout
    del watch._values[keys.lease(3, 2)]  # etcd expired node 2's lease
    assert peers.stale() == [2]
    peers.forget(2)
    clock.time = 2.5
    assert peers.stale() == []  # a slow starter gets three timeouts
    clock.time = 6.5
    assert peers.stale() == [4]  # never took its place
    watch._values[keys.lease(3, 2)] = b"z"
    assert peers.stale() == [4]  # a forgotten node is not revived


def test_nodes_start_on_members_spread_by_address_and_leave_a_failed_one_together() -> None:
    from rtrain.agent.store.etcd.client import EtcdClient
    from rtrain.agent.store.etcd.members import Members, first_member

    starts = [first_member(f"10.0.0.{i}", 3) for i in range(1, 4)]
    assert sorted(starts) == [0, 1, 2]  # consecutive addresses: every member once
    assert first_member("node017", 3) == first_member("node017", 3) in (0, 1, 2)
    client = EtcdClient([("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)])
    client.members = Members(3, starts[0])
    keeper = client.copy()
    kicked: list[int] = []
    assert keeper.members.watch(client.current, lambda: kicked.append(1))
    client.leave(client.current)
    keeper.leave(starts[0])  # the same failure, seen by a copy too: one move, not two
    assert keeper.current == client.current == (starts[0] + 1) % 3 and kicked == [1]
    client.limit_attempts(0.5)
    assert client.first_attempt_s == client.copy().first_attempt_s == 0.5
    assert client.attempt_s == client.copy().attempt_s == 2.0  # a pass after all failed


def test_a_gone_peer_is_named_only_once_this_nodes_own_lease_was_renewed_after() -> None:
    keys = StoreKeys("job")
    watch = _Watch()
    clock = FakeClock(0.0)
    renewed: list[float] = []  # keep-alives of this node's lease, by when they were sent
    asked: list[float] = []
    peers = EtcdPeerLeases(
        watch.items, keys, 0, [1], timeout=2.0, clock=clock.clock,
        alive_since=lambda t: any(sent > t for sent in renewed),
        renew_now=lambda: asked.append(clock.time),
    )  # fmt: skip
    watch._values = {keys.lease(0, 1): b"x"}
    renewed.append(0.5)
    assert peers.stale() == []
    clock.time = 1.0
    del watch._values[keys.lease(0, 1)]  # node 1's key went; was it only node 1's lease?
    assert peers.stale() == [] and asked == [1.0]  # not before this node's own renewal
    clock.time = 1.2
    assert peers.stale() == [] and asked == [1.0, 1.2]  # its own lapsed too: nobody named
    renewed.append(1.1)  # a keep-alive sent after the key was found gone came back
    assert peers.stale() == [1]
