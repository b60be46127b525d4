"""`rtrain status`'s pure part: the agents' status records and the view built from them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtrain.core.observe.status import (
    STATUS_EVERY_S,
    JobStatus,
    NodeStatus,
    failure_views,
    node_views,
    status_period,
)
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, ProtocolError

MEMBERS = Membership(3, [MemberInfo(f"n{i}", f"10.0.0.{i}", 2) for i in range(3)])


def record(t: float = 100.0, steps: tuple[int | None, ...] = (7, 8)) -> NodeStatus:
    return NodeStatus(t, "running", (0, 1), steps, committed=7, replicated=6)


def test_a_record_round_trips() -> None:
    assert NodeStatus.decode(record().encode()) == record()
    assert NodeStatus.decode(record(steps=(None, 3)).encode()).steps == (None, 3)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"v": 2}, "version"),
        ({"t": "soon"}, "t must be"),
        ({"t": None}, "t must be"),
        ({"state": ""}, "state"),
        ({"ranks": [0]}, "differ in length"),
        ({"ranks": [0, -1]}, "not a step or rank"),
        ({"steps": [True, 1]}, "not a step or rank"),
        ({"steps": "7,8"}, "must be a list"),
        ({"ranks": list(range(5000)), "steps": [1] * 5000}, "at most"),
        ({"committed": -3}, "committed"),
        ({"replicated": 1.5}, "replicated"),
    ],
)
def test_a_record_rtrain_did_not_write_is_refused(change: dict, fragment: str) -> None:
    data = {**json.loads(record().encode()), **change}
    with pytest.raises(ProtocolError, match=fragment):
        NodeStatus.decode(json.dumps(data))


@given(st.binary(max_size=300))
def test_any_bytes_are_a_record_or_refused(payload: bytes) -> None:
    try:
        decoded = NodeStatus.decode(payload)
    except ProtocolError:
        return
    assert NodeStatus.decode(decoded.encode()) == decoded


ANY = (
    st.none()
    | st.booleans()
    | st.integers(-5, 10)
    | st.floats()
    | st.text(max_size=5)
    | st.lists(st.none() | st.integers(-2, 9), max_size=4)
)
FIELDS = ["v", "t", "state", "ranks", "steps", "committed", "replicated"]


@given(st.fixed_dictionaries({}, optional=dict.fromkeys(FIELDS, ANY)))
def test_any_json_object_is_a_record_or_refused(data: dict) -> None:
    try:
        decoded = NodeStatus.decode(json.dumps(data))
    except ProtocolError:
        return
    assert NodeStatus.decode(decoded.encode()) == decoded


def test_each_member_gets_its_record_its_age_and_what_is_wrong_with_it() -> None:
    now = 100.0 + 4 * STATUS_EVERY_S
    views = node_views(
        MEMBERS, [record(t=now - 1).encode().encode(), b"{garbage", record().encode()], [], now
    )
    fresh, refused, stale = views
    assert fresh.seen and fresh.age_s == pytest.approx(1.0) and fresh.addr == "10.0.0.0"
    assert refused.status is None and refused.problem.startswith("refused: status record")
    assert stale.status == record() and "not renewed for 20s" in stale.problem
    lost = node_views(MEMBERS, [None, None, record(t=now).encode()], [2], now)
    assert [v.problem for v in lost] == ["", "", "lost (its lease expired)"]
    assert [v.seen for v in lost] == [False, False, False]


def test_the_job_step_is_the_slowest_workers_and_failures_come_in_order() -> None:
    late = record(t=100.0, steps=(5, None))
    views = node_views(MEMBERS, [record().encode(), late.encode(), None], [], 101.0)
    records = {
        1: [
            FailureRecord(FailureKind.EXIT, 1, 0, "10.0.0.0", 50.0, 1, 1, message="boom\nx"),
            FailureRecord(FailureKind.LOST_NODE, 1, 2, "10.0.0.2", 40.0),
        ],
        0: [FailureRecord(FailureKind.SIGNAL, 0, 1, "10.0.0.1", 60.0, 0, 2)],
    }
    view = JobStatus("j", 3, 3, True, 0, views, failure_views(records), 0, reads=5)
    assert view.step == 5
    out = view.as_json()
    assert [(f["generation"], f["kind"]) for f in out["failures"]] == [
        (0, "signal"),
        (1, "lost_node"),
        (1, "exit"),
    ]
    assert out["failures"][2]["message"] == "boom"
    assert out["nodes"][2]["state"] is None and out["store_reads"] == 5
    json.dumps(out)  # plain JSON all the way down


def test_each_failure_says_its_part_the_blocked_ranks_are_victims() -> None:
    """The hang charged to the rank that stopped, not to the healthy rank found hung
    first, waiting in the collective for it (rtrain status's "role")."""
    waiting = (
        "hung: no heartbeat for 2.0s (waiting in a collective: likely a victim of another rank)"
    )
    records = {
        0: [
            FailureRecord(FailureKind.HANG, 0, 0, "10.0.0.0", 50.0, 0, 0, message=waiting),
            FailureRecord(
                FailureKind.HANG, 0, 1, "10.0.0.1", 50.2, 0, 1, message="(process stopped)"
            ),
        ]
    }
    out = [(f.node_rank, f.role) for f in failure_views(records)]
    assert out == [(0, "victim"), (1, "root cause")]


def test_the_jobs_status_writes_stay_flat_as_it_grows_and_readers_wait_as_long() -> None:
    """Issue 36: 2,000 nodes writing every 5 s were 400 writes a second; past 64 nodes
    each writes less often, so the job writes 12.8 a second at any size, and a reader
    calls a record stale only after as many of the longer periods."""
    assert status_period(1) == status_period(64) == STATUS_EVERY_S
    for nodes in (64, 256, 2000, 12_500):
        assert nodes / status_period(nodes) == pytest.approx(64 / STATUS_EVERY_S)
    big = Membership(0, [MemberInfo(f"id{n}", f"10.0.{n >> 8}.{n & 255}", 1) for n in range(2000)])
    now = 1000.0
    aged = record(t=now - 100).encode()  # 100 s: stale at 64 nodes (15 s), not at 2,000
    views = node_views(big, [aged] * 2000, [], now)
    assert all(v.problem == "" for v in views)
    small = node_views(MEMBERS, [aged, aged, aged], [], now)
    assert all("not renewed" in v.problem for v in small)
