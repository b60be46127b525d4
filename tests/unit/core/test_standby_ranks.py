"""Which node ranks a round closes with after a node is lost (core/rendezvous/closing.py
closing_order): a standby takes the lost node's rank and every survivor keeps its own,
so the survivors' workers kept by a repair in place resume on the same global ranks;
without a standby the job shrinks, the ranks past the end closing up."""

from __future__ import annotations

from rtrain.core.rendezvous.closing import closing_order
from rtrain.core.rendezvous.protocol import MemberInfo, Membership


def node(name: str, last: int, prev: int | None = None) -> MemberInfo:
    return MemberInfo(node_id=name, addr=f"10.0.0.{last}", local_world_size=2, prev_rank=prev)


# generation 0 ran n0, n1, n2 (node ranks 0, 1, 2); n1 was lost
SURVIVORS = {"n0", "n2"}


def ranks(members: tuple[MemberInfo, ...]) -> dict[str, list[int]]:
    membership = Membership(1, members)
    found = {}
    for member in members:
        place = membership.assignment(member.node_id, "h", 1)
        found[member.node_id] = [place.rank_offset + i for i in range(place.local_world_size)]
    return found


def test_a_standby_takes_the_lost_nodes_rank_and_the_survivors_keep_theirs() -> None:
    # the standby joined the round first (slot 1) while generation 0 ran
    joined = [node("spare", 9), node("n2", 3, 2), node("n0", 1, 0)]
    ordered = closing_order(joined, 3, SURVIVORS, static=False)
    assert [m.node_id for m in ordered] == ["n0", "spare", "n2"]
    assert ranks(ordered) == {"n0": [0, 1], "spare": [2, 3], "n2": [4, 5]}


def test_without_a_standby_the_job_shrinks_and_the_ranks_close_up() -> None:
    joined = [node("n2", 3, 2), node("n0", 1, 0)]
    ordered = closing_order(joined, 3, SURVIVORS, static=False)
    assert [m.node_id for m in ordered] == ["n0", "n2"]
    assert ranks(ordered) == {"n0": [0, 1], "n2": [2, 3]}


def test_the_first_standby_by_slot_takes_the_place_and_the_others_wait() -> None:
    joined = [node("s1", 8), node("s2", 7), node("n0", 1, 0), node("n2", 3, 2)]
    ordered = closing_order(joined, 3, SURVIVORS, static=False)
    assert [m.node_id for m in ordered] == ["n0", "s1", "n2"]


def test_a_standby_back_from_an_older_generation_does_not_take_a_survivors_rank() -> None:
    # "old" held node rank 2 in an older generation (it was fenced, came back and waits
    # as a standby) and still says so; n2 holds rank 2 now. A lower address would have
    # won the tie: n2 moved to rank 1, its kept workers resumed on ranks 2-3, not 4-5.
    joined = [node("old", 2, 2), node("n2", 3, 2), node("n0", 1, 0)]
    ordered = closing_order(joined, 3, SURVIVORS, static=False)
    assert [m.node_id for m in ordered] == ["n0", "old", "n2"]
    assert ranks(ordered)["n2"] == [4, 5]


def test_without_known_survivors_every_previous_rank_counts() -> None:
    # a closer that knows no survivors (it ran in no generation) keeps today's rule
    joined = [node("a", 2, 1), node("b", 3, 0), node("c", 4)]
    ordered = closing_order(joined, 3, frozenset(), static=False)
    assert [m.node_id for m in ordered] == ["b", "a", "c"]


def test_a_previous_rank_nobody_else_claims_is_kept_by_any_node() -> None:
    # a closer from an older generation knows only n0 for a survivor: n2's rank, which
    # nobody else claims, is still n2's; the standby takes the free one
    joined = [node("spare", 9), node("n2", 3, 2), node("n0", 1, 0)]
    ordered = closing_order(joined, 3, {"n0"}, static=False)
    assert [m.node_id for m in ordered] == ["n0", "spare", "n2"]
