"""core.snapshots.admission: which shard requests a node's shard server serves."""

from __future__ import annotations

from rtrain.core.snapshots.admission import (
    Admission,
    Reason,
    StepCeiling,
    confirmed_step,
    superseded_by,
)


def admission() -> Admission:
    """Generation 3; replicas from 127.0.0.2; members 127.0.0.1-2; its workers at 10."""
    found = Admission(3, frozenset({"127.0.0.2"}), frozenset({"127.0.0.1", "127.0.0.2"}))
    found.ceiling.observe(9)
    found.ceiling.observe(10)
    return found


def reason(refusal: object) -> Reason | None:
    return getattr(refusal, "reason", None)


def test_a_connection_from_no_members_address_is_refused():
    judge = admission()
    assert judge.refuse_connection("127.0.0.1") is None
    refused = judge.refuse_connection("127.0.0.9")
    assert reason(refused) is Reason.STRANGER and "not a member of generation 3" in str(refused)
    assert reason(Admission().refuse_connection("127.0.0.1")) is Reason.STRANGER  # none yet


def test_the_newest_replica_kept_is_unconfirmed_until_a_newer_one_supersedes_it():
    assert confirmed_step([]) is None
    assert confirmed_step([10]) is None
    assert confirmed_step([9, 10]) == 9
    assert confirmed_step([10, 9, 10]) == 9
    assert superseded_by(9, [8, 10, 11]) == [10, 11]
    assert superseded_by(10, [9, 10]) == []


def test_a_step_behind_an_unconfirmed_replica_goes_in_and_one_behind_a_confirmed_does_not():
    judge = admission()
    assert judge.refuse_put("127.0.0.2", 3, 9, [8, 10]) is None  # 10: never confirmed
    assert judge.refuse_put("127.0.0.2", 3, 4, [10]) is None
    refused = judge.refuse_put("127.0.0.2", 3, 7, [8, 10])
    assert reason(refused) is Reason.OLDER and "step 8" in str(refused)


def test_every_refusal_names_its_reason():
    judge = admission()
    cases = [
        (("127.0.0.2", 2, 9, []), Reason.GENERATION),
        (("127.0.0.1", 3, 9, []), Reason.SENDER),
        (("127.0.0.2", 3, 13, []), Reason.BEYOND),  # at most 10 + 2
    ]
    for args, expected in cases:
        assert reason(judge.refuse_put(*args)) is expected, args
    assert judge.refuse_put("127.0.0.2", 3, 12, []) is None
    assert reason(judge.refuse_get("127.0.0.9")) is Reason.READER
    assert judge.refuse_get("127.0.0.2") is None


def test_a_lifted_ceiling_admits_any_step_until_the_node_commits_past_it() -> None:
    """A node of new workers joining kept ranks elsewhere (train-through) judges no
    replica by its own progress until one of them commits a newer step; its restored
    shards, seen again by the slot scan, do not count."""
    ceiling = StepCeiling()
    ceiling.observe(21)  # the restored step
    ceiling.lift()
    ceiling.observe(21)  # the scan sees the restored shard again
    assert ceiling.limit is None
    ceiling.observe(40)  # its first own commit, after it joined
    assert ceiling.limit == 40 + 2 * 19
