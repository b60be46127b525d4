"""Who of a round's joiners closes it, and when: core/rendezvous/closing.py's decision,
every branch, without a store or a clock."""

from __future__ import annotations

from rtrain.core.rendezvous.closing import (
    BACKUP_CLOSE_S,
    FOLLOWER_POLL_S,
    LAST_RESORT_CLOSE_S,
    LAST_RESORT_GROUPS,
    Closing,
    check_close,
    look_now,
    role,
    start_closing,
    survivors_first,
)
from rtrain.core.rendezvous.protocol import MemberInfo

POLL = 0.02


def test_slot_one_and_the_filler_close_backups_and_last_resorts_look_later() -> None:
    assert role(1, 8, POLL) == role(8, 8, POLL)
    assert role(1, 8, POLL).closer and role(1, 8, POLL).first_look == 0.0
    backup = role(2, 8, POLL)
    assert not backup.closer and (backup.first_look, backup.poll) == (
        BACKUP_CLOSE_S,
        FOLLOWER_POLL_S,
    )
    last = role(7, 8, POLL)
    assert last.first_look == LAST_RESORT_CLOSE_S + (7 % LAST_RESORT_GROUPS) * BACKUP_CLOSE_S


def test_a_follower_looks_after_its_first_look_then_every_backup_period() -> None:
    follower = role(3, 8, POLL)
    closing = start_closing(follower, 100.0)
    closing, look = look_now(closing, follower, 100.5)
    assert not look
    closing, look = look_now(closing, follower, 101.0)
    assert look and closing.next_look == 101.0 + BACKUP_CLOSE_S
    assert not look_now(closing, follower, 101.5)[1]
    closer = role(1, 8, POLL)
    assert look_now(start_closing(closer, 100.0), closer, 100.0)[1]


def test_a_closer_closes_a_full_round_at_once_a_follower_after_the_backup_period() -> None:
    closer, follower = role(1, 4, POLL), role(2, 4, POLL)
    assert check_close(Closing(0.0), closer, 10.0, 4, 2, 4, 30.0, False)[1] == 4
    closing, size = check_close(Closing(0.0), follower, 10.0, 4, 2, 4, 30.0, False)
    assert size is None and closing.closable_since == 10.0
    assert check_close(closing, follower, 10.0 + BACKUP_CLOSE_S, 4, 2, 4, 30.0, False)[1] == 4


def test_a_quorum_waits_for_the_last_call_unless_every_survivor_joined() -> None:
    closer = role(1, 4, POLL)
    closing, size = check_close(Closing(0.0), closer, 10.0, 2, 2, 4, 30.0, False)
    assert size is None and closing.quorum_since == 10.0
    assert check_close(closing, closer, 39.0, 2, 2, 4, 30.0, False)[1] is None
    assert check_close(closing, closer, 40.0, 2, 2, 4, 30.0, False)[1] == 2
    assert check_close(Closing(0.0), closer, 10.0, 2, 2, 4, 30.0, True)[1] == 2
    # below the quorum nothing closes, and a round no longer closable is found so anew
    closing, size = check_close(Closing(0.0, 5.0, 6.0), closer, 10.0, 1, 2, 4, 30.0, True)
    assert size is None and closing.closable_since is None


def test_a_spare_never_closes_at_once_whatever_its_slot() -> None:
    for slot in (1, 2, 8, 9, 500):
        spare = role(slot, 8, POLL, spare=True)
        assert not spare.closer and spare.first_look >= LAST_RESORT_CLOSE_S


def test_a_full_round_waits_for_a_survivor_still_coming_until_the_last_call() -> None:
    closer = role(9, 8, POLL)
    closing = start_closing(closer, 0.0)
    closing, size = check_close(closing, closer, 0.0, 9, 1, 8, 30.0, False, True)
    assert size is None  # full of spares, a survivor not in yet
    _, size = check_close(closing, closer, 1.0, 10, 1, 8, 30.0, True, False)
    assert size == 8
    _, size = check_close(closing, closer, 30.0, 9, 1, 8, 30.0, False, True)
    assert size == 8  # the survivor never came: the last call


def test_the_survivors_come_first_then_the_spares_by_slot() -> None:
    def node(n: int, prev: int | None = None) -> MemberInfo:
        return MemberInfo(node_id=f"n{n}", addr=f"10.0.0.{n}", local_world_size=1, prev_rank=prev)

    joined = [node(1), node(2), node(3, 0), node(4), node(5, 1)]
    assert [m.node_id for m in survivors_first(joined, 3)] == ["n3", "n5", "n1"]
    assert [m.node_id for m in survivors_first(joined[:2], 3)] == ["n1", "n2"]


def test_the_expected_survivors_come_before_a_node_of_an_older_generation() -> None:
    def node(n: int, prev: int | None = None) -> MemberInfo:
        return MemberInfo(node_id=f"n{n}", addr=f"10.0.0.{n}", local_world_size=1, prev_rank=prev)

    # n1 was in an older generation (a stale prev_rank); n2 and n3 ran the last one
    joined = [node(1, 5), node(2, 0), node(3, 1), node(4)]
    assert [m.node_id for m in survivors_first(joined, 2, {"n2", "n3"})] == ["n2", "n3"]
    assert [m.node_id for m in survivors_first(joined, 3, {"n2", "n3"})] == ["n2", "n3", "n1"]
