"""The records agents agree on a restore through: they read back what was written, and
refuse anything else with a ProtocolError (from the store, anything may be there)."""

from __future__ import annotations

import json

import pytest

from rtrain.core.rendezvous.protocol import ProtocolError
from rtrain.core.snapshots.restore_plan import Reached, ShardId, Written, written_in
from rtrain.core.snapshots.restore_records import Inventory, RestoreOutcome


def test_an_inventory_reads_back_as_written() -> None:
    inventory = Inventory((ShardId(0, 1, 8), ShardId(0, 2, 7)), 8, True)
    assert Inventory.decode(inventory.encode()) == inventory
    assert Inventory.decode(Inventory(()).encode()) == Inventory(())
    assert inventory.reached(was_member=True) == Reached(8, True, True)


def test_an_outcome_reads_back_as_written() -> None:
    outcome = RestoreOutcome(False, frozenset({(ShardId(1, 0, 5), 2), (ShardId(1, 3, 5), 0)}))
    assert RestoreOutcome.decode(outcome.encode()) == outcome
    assert RestoreOutcome.decode(RestoreOutcome(True).encode()) == RestoreOutcome(True)


INVENTORY = {"v": 1, "shards": [[0, 1, 8]], "reached": 8, "every_rank": True}


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"v": None},
        {"shards": "not a list"},
        {"shards": [[0, 1]]},
        {"shards": [[0, 1, 8, 9]]},
        {"shards": [[0, True, 8]]},
        {"shards": [[0, 1, "8"]]},
        {"shards": [[0, 1, 8.0]]},
        {"shards": [[-1, 1, 8]]},
        {"shards": [None]},
        {"reached": -3},
        {"reached": "8"},
        {"reached": False},
        {"every_rank": 1},
        {"every_rank": None},
    ],
)
def test_an_inventory_of_the_wrong_shape_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="shard inventory"):
        Inventory.decode(json.dumps({**INVENTORY, **change}))


@pytest.mark.parametrize("missing", ["v", "shards", "reached", "every_rank"])
def test_an_inventory_missing_a_field_is_refused(missing: str) -> None:
    data = {k: v for k, v in INVENTORY.items() if k != missing}
    with pytest.raises(ProtocolError, match="shard inventory"):
        Inventory.decode(json.dumps(data))


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe",
        "not json",
        "[1, 2]",
        '{"v": 1, "complete": "yes", "bad": []}',
        '{"v": 1, "complete": true}',
        '{"v": 1, "complete": true, "bad": [[0, 0, 0]]}',
        '{"v": 1, "complete": false, "bad": [[0, 0, 0, false]]}',
        '{"v": 1, "complete": false, "bad": [["0", 0, 0, 1]]}',
        '{"complete": true, "bad": []}',
    ],
)
def test_an_outcome_of_the_wrong_shape_is_refused(payload: str | bytes) -> None:
    with pytest.raises(ProtocolError, match="restore outcome"):
        RestoreOutcome.decode(payload)


def test_where_a_save_was_loaded_from_reads_back_and_is_checked() -> None:
    inventory = Inventory((ShardId(2, 0, 8),), 8, True, Written(0, 8))
    assert Inventory.decode(inventory.encode()) == inventory
    for loaded in ([0], [0, "8"], [0, -8], [True, 8], "0,8"):
        with pytest.raises(ProtocolError, match="shard inventory"):
            Inventory.decode(json.dumps({**INVENTORY, "loaded": loaded}))


def test_a_save_restored_again_is_read_where_it_was_written() -> None:
    # generation 2 restores step 8: generation 1's workers had been restored to step 8
    # from generation 0's shards and saved nothing since, so those are the save's
    assert written_in(2, 8, [Written(0, 8), Written(0, 8)]) == Written(0, 8)
    # a new node knows nothing, the others say where: still generation 0
    assert written_in(2, 8, [Written(0, 8)]) == Written(0, 8)
    # step 8 was restored, but the new restore is of step 9, written in generation 1
    assert written_in(2, 9, [Written(0, 8)]) == Written(1, 9)
    # nothing loaded before (the first restore): the previous generation's
    assert written_in(1, 5, []) == Written(0, 5)
    # a claim from this generation or later is no earlier save: ignored
    assert written_in(2, 8, [Written(2, 8), Written(5, 8)]) == Written(1, 8)


def test_a_save_carried_over_a_generation_that_restored_nothing_is_read_where_written() -> None:
    # generation 1 ended before its restore: generation 2 restored generation 0's
    # shards of step 3, carried over (read_from=0); a resharding load names those,
    # not generation 1's, which nothing holds (before: Written(1, 3))
    assert written_in(2, 3, [], read_from=0) == Written(0, 3)
    # generation 1 had itself been restored to step 3 from generation 0 and saved
    # nothing; generation 2 ended before its restore: generation 3 read generation
    # 1's relabelled copies, and the nodes say the save is generation 0's
    assert written_in(3, 3, [Written(0, 3)], read_from=1) == Written(0, 3)
