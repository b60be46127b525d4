"""The rendezvous protocol's pure rules, and refusal of values rtrain did not write."""

from __future__ import annotations

import json
import zlib

import pytest

from rtrain.core.rendezvous.compressed import COMPRESSED, MAX_MEMBERSHIP_BYTES
from rtrain.core.rendezvous.failures import (
    FailureRecord,
    RecordError,
    error_file_payload,
    parse_error_file,
    root_cause_first,
)
from rtrain.core.rendezvous.protocol import (
    AbortRecord,
    MemberInfo,
    Membership,
    ProtocolError,
    decode_master,
    encode_master,
    members_to_close,
    order_members,
)


def member(
    node_id: str, lws: int = 2, requested: int | None = None, prev: int | None = None
) -> MemberInfo:
    return MemberInfo(
        node_id=node_id,
        addr=f"{node_id}.host",
        local_world_size=lws,
        requested_rank=requested,
        prev_rank=prev,
    )


def test_member_and_membership_round_trip():
    m = Membership(3, (member("a"), member("b", lws=4)))
    decoded = Membership.decode(m.encode(), 3)
    assert decoded == m
    assignment = decoded.assignment("b", "a.host", 1234)
    assert (assignment.node_rank, assignment.rank_offset, assignment.world_size) == (1, 2, 6)
    assert assignment.global_rank(3) == 5


def test_membership_of_another_generation_is_refused():
    with pytest.raises(ProtocolError, match="generation"):
        Membership.decode(Membership(3, (member("a"),)).encode(), 4)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe",
        b"not json",
        b"[1, 2]",
        json.dumps({"v": 99, "node_id": "a", "addr": "h", "local_world_size": 1}),
        json.dumps({"v": 1, "node_id": "", "addr": "h", "local_world_size": 1}),
        json.dumps({"v": 1, "node_id": "a", "addr": "h", "local_world_size": 0}),
        json.dumps({"v": 1, "node_id": "a", "addr": "h", "local_world_size": True}),
        json.dumps({"v": 1, "node_id": "a", "addr": "h", "local_world_size": 1, "prev_rank": -1}),
    ],
)
def test_garbage_member_is_refused(payload):
    with pytest.raises(ProtocolError):
        MemberInfo.decode(payload)


def test_garbage_membership_abort_and_master_are_refused():
    with pytest.raises(ProtocolError):
        Membership.decode(json.dumps({"v": 1, "generation": 0, "members": []}), 0)
    with pytest.raises(ProtocolError, match="twice"):
        twice = {"v": 1, "node_id": "a", "addr": "x", "local_world_size": 1}
        text = json.dumps({"v": 1, "generation": 0, "members": [twice, twice]})
        Membership.decode(COMPRESSED + zlib.compress(text.encode()), 0)
    with pytest.raises(ProtocolError):
        AbortRecord.decode(json.dumps({"generation": "x", "node_rank": 0, "exit_code": 1}))
    with pytest.raises(ProtocolError):
        decode_master(json.dumps({"v": 1, "host": "h", "port": 0}))
    assert decode_master(encode_master("h", 5)) == ("h", 5)
    assert AbortRecord.decode(AbortRecord(1, 2, "why", 75).encode()) == AbortRecord(1, 2, "why", 75)


def test_c10d_order_keeps_previous_ranks_and_fills_gaps_in_join_order():
    # old node 0 was lost: its replacement takes rank 0, the survivor stays rank 1
    joined = [member("old1", prev=1), member("new")]
    assert [m.node_id for m in order_members(joined, static=False)] == ["new", "old1"]
    # the job shrank: rank 3 is past the end, so old3 takes the first free rank, before
    # the newcomer
    joined = [member("new"), member("old3", prev=3), member("old1", prev=1)]
    assert [m.node_id for m in order_members(joined, static=False)] == ["old3", "old1", "new"]


def test_c10d_order_keeps_previous_ranks_then_join_order():
    joined = [member("new1"), member("old1", prev=1), member("new2"), member("old0", prev=0)]
    assert [m.node_id for m in order_members(joined, static=False)] == [
        "old0",
        "old1",
        "new1",
        "new2",
    ]


def test_static_order_uses_given_ranks_and_refuses_duplicates():
    joined = [member("x", requested=1), member("y", requested=0)]
    assert [m.node_id for m in order_members(joined, static=True)] == ["y", "x"]
    with pytest.raises(ProtocolError, match="exactly once"):
        order_members([member("x", requested=0), member("y", requested=0)], static=True)
    with pytest.raises(ProtocolError, match="twice"):
        order_members([member("x"), member("x")], static=False)


@pytest.mark.parametrize(
    ("joined", "lo", "hi", "age", "last_call", "expected"),
    [
        (2, 2, 2, None, 30, 2),  # full: close at once
        (1, 2, 2, None, 30, None),  # below quorum
        (2, 2, 4, 0.0, 30, None),  # quorum, last call still open
        (3, 2, 4, 31.0, 30, 3),  # last call over: close with who is there
        (5, 2, 4, None, 30, 4),  # more than max: only max are members
    ],
)
def test_members_to_close(joined, lo, hi, age, last_call, expected):
    assert members_to_close(joined, lo, hi, age, last_call) == expected


def test_members_to_close_skips_last_call_once_the_survivors_are_in():
    # after a node loss: the 2 survivors joined, nobody else is known to come
    assert members_to_close(2, 2, 3, 0.0, 30, survivors_in=True) == 2
    # a survivor is missing: wait for it (or for the last call)
    assert members_to_close(2, 2, 3, 0.0, 30, survivors_in=False) is None
    # survivors in, but fewer than --nnodes MIN: keep waiting for a replacement
    assert members_to_close(1, 2, 3, 0.0, 30, survivors_in=True) is None


def test_failure_record_round_trip_and_refusal():
    record = FailureRecord(
        kind="signal", generation=1, node_rank=0, host="h", time=5.0, rank=3, exitcode=-9
    )
    assert FailureRecord.decode(record.encode()) == record
    assert record.describe_exit() == "SIGKILL (-9)"
    with pytest.raises(RecordError):
        FailureRecord.decode(
            json.dumps({"kind": "meteor", "generation": 0, "node_rank": 0, "host": "h", "time": 1})
        )
    with pytest.raises(RecordError):
        FailureRecord.decode(b"garbage")


def test_root_cause_is_the_earliest_failure():
    late = FailureRecord(
        kind="exit", generation=0, node_rank=0, host="h", time=9.0, rank=0, exitcode=1
    )
    early = FailureRecord(
        kind="exit", generation=0, node_rank=1, host="h", time=2.0, rank=2, exitcode=3
    )
    assert root_cause_first([late, early]) == [early, late]


def test_error_file_format_matches_torch_record():
    content = parse_error_file(error_file_payload("ValueError: x", "Traceback...", 17.0))
    assert (content.message, content.traceback, content.timestamp) == (
        "ValueError: x",
        "Traceback...",
        17.0,
    )
    assert parse_error_file(json.dumps({"message": "plain"})).message == "plain"
    with pytest.raises(RecordError):
        parse_error_file("{")


def test_failure_report_prints_text_that_looks_like_markup():
    """Errors from gloo contain '[/path:line]', which rich would read as a closing tag."""
    import io

    from rich.console import Console

    from rtrain.cli.render.launch import failure_report

    record = FailureRecord(
        kind="exit", generation=0, node_rank=0, host="[h]", time=1.0, rank=0, local_rank=0,
        exitcode=1, message="Connection closed by peer [/__w/gloo/pair.cc:553]",
        traceback="Traceback [/x]", error_file="/tmp/[e].json",
    )  # fmt: skip
    buffer = io.StringIO()
    failure_report(Console(file=buffer, width=200), "[/t].py", [record], "gave up [/y]")
    text = buffer.getvalue()
    assert "[/__w/gloo/pair.cc:553]" in text and "gave up [/y]" in text and "[/t].py FAILED" in text


def test_a_peer_broken_collective_is_never_the_root_cause():
    # rank 0 died of rank 4's exit (reaped first), rank 4 exited on its own (reaped later)
    victim = FailureRecord(
        kind="exit",
        generation=0,
        node_rank=0,
        host="a",
        time=1.0,
        rank=0,
        exitcode=1,
        message="RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer",
    )
    culprit = FailureRecord(
        kind="exit", generation=0, node_rank=2, host="c", time=1.2, rank=4, exitcode=3
    )
    assert root_cause_first([victim, culprit]) == [culprit, victim]


def test_c10d_newcomers_are_ordered_by_address_not_by_who_started_first():
    from dataclasses import replace

    joined = [
        replace(member(f"n{i}"), addr=addr)
        for i, addr in enumerate(["127.0.0.3", "127.0.0.10", "127.0.0.2", "b", "a"])
    ]
    ordered = [m.addr for m in order_members(joined, static=False)]
    assert ordered == ["127.0.0.2", "127.0.0.3", "127.0.0.10", "a", "b"]


def test_a_big_membership_is_stored_compressed_and_read_back_whole():
    members = tuple(member(f"{n:032x}", lws=8, prev=n) for n in range(2048))
    payload = Membership(1, members).encode()
    plain = json.dumps({"members": [{"node_id": m.node_id} for m in members]})
    assert len(payload) < len(plain) / 4
    assert Membership.decode(payload, 1).members == members


@pytest.mark.parametrize(
    "payload",
    [
        COMPRESSED + b"not zlib at all",
        COMPRESSED + zlib.compress(b'{"v": 1, "generation": 1, "members": []}')[:-6],  # cut
        COMPRESSED + zlib.compress(b"[" * (MAX_MEMBERSHIP_BYTES + 1)),  # a bomb
        COMPRESSED + zlib.compress(b"\xff\xfe not text"),
    ],
)
def test_a_forged_compressed_membership_is_refused(payload: bytes):
    with pytest.raises(ProtocolError, match="membership"):
        Membership.decode(payload, 1)
