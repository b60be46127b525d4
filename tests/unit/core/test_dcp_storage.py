"""torch.distributed.checkpoint over rtrain's memory in one process: dcp.save with
SnapshotWriter into a slot, dcp.load with SnapshotReader back, and the index a shard
carries, which is read from shared memory and so is checked field by field."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
import torch

from rtrain.core.contract.dcp_index import parse_index
from rtrain.core.snapshots.format import SnapshotError
from rtrain.core.worker import snapshots as snapshot_api
from tests.unit.core.test_snapshot_api import _mark_replicated

pytestmark = [
    pytest.mark.slow,  # importing torch.distributed.checkpoint takes seconds
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def raised(error: BaseException) -> BaseException:
    """What rank 0 raised: DCP wraps it in a CheckpointException."""
    failures = getattr(error, "failures", None)
    return failures[0][0] if failures else error


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return {
        "model": model.state_dict(),
        "extra": {"scale": torch.randn(5).double(), "note": f"seed {seed}", "epoch": seed},
        "steps": [1, 2.5, None],
    }


def test_a_save_loads_back_bitwise_with_its_plain_values(slot_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

    assert restored_step() is None
    saved = _state(1)
    dcp.save(saved, storage_writer=SnapshotWriter(3), no_dist=True)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None  # a restarted worker
    assert restored_step() == 3
    loaded = _state(2)
    dcp.load(loaded, storage_reader=SnapshotReader(), no_dist=True)
    for key in saved["model"]:
        assert torch.equal(loaded["model"][key], saved["model"][key])
    assert torch.equal(loaded["extra"]["scale"], saved["extra"]["scale"])
    assert loaded["extra"]["note"] == "seed 1" and loaded["extra"]["epoch"] == 1
    assert loaded["steps"] == [1, 2.5, None]


def test_a_value_with_no_plain_form_is_refused_at_save_by_name(slot_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    from rtrain.core.worker.dcp import SnapshotWriter

    state = {"model": {"w": torch.ones(2)}, "schedule": {"fn": Path("/tmp")}}
    with pytest.raises(BaseException) as error:  # a CheckpointException
        dcp.save(state, storage_writer=SnapshotWriter(1), no_dist=True)
    assert re.search(r"schedule\.fn: a PosixPath cannot be snapshotted", str(raised(error.value)))


def test_a_load_with_nothing_restored_says_so(slot_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    from rtrain.core.worker.dcp import SnapshotReader

    with pytest.raises(BaseException) as error:  # a CheckpointException
        dcp.load({"w": torch.ones(2)}, storage_reader=SnapshotReader(), no_dist=True)
    assert "no snapshot was restored for this rank" in str(raised(error.value))


GOOD = {
    "format": "rtrain-dcp-1",
    "save_id": "ab12",
    "writers": 2,
    "step": 4,
    "items": [
        [0, 0, "model.w", [0, 0], "s", [0, 0], [2, 3], "float32", [4, 3], True],
        [1, 0, "model.w", [2, 0], "s", [2, 0], [2, 3], "float32", [4, 3], True],
        [1, 1, "epoch", None, "b", None, None, None, None, False],
    ],
    "planner_data": [["model.w", ["model", "w"]], ["epoch", ["epoch"]]],
}


def _with(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def test_an_index_round_trips() -> None:
    index = parse_index(json.dumps(GOOD))
    assert parse_index(index.to_json()) == index
    assert index.items[1].chunk_offsets == (2, 0) and index.planner_data is not None


@pytest.mark.parametrize(
    "text",
    [
        _with(format="rtrain-dcp-0"),
        _with(save_id="../x"),
        _with(writers=0),
        # a chunk from a writer the save did not have, one outside its tensor, one of
        # another rank than its tensor, a dtype that holds objects, a value with a shape
        _with(items=[[2, 0, "w", [0], "t", [0], [4], "float32", [4], False]]),
        _with(items=[[0, 0, "w", [2], "s", [2], [4], "float32", [4], False]]),
        _with(items=[[0, 0, "w", [0], "s", [0], [4, 1], "float32", [4], False]]),
        _with(items=[[0, 0, "w", [0], "t", [0], [4], "object", [4], False]]),
        _with(items=[[0, 0, "w", None, "b", None, None, None, [4], False]]),
        _with(planner_data=[["w", [{"d": 1}]]]),
        "[" * 10000,
        42,
    ],
)
def test_a_forged_index_is_refused(text) -> None:
    with pytest.raises(SnapshotError):
        parse_index(text)


def test_any_json_as_an_index_gives_an_index_or_a_refusal() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    leaves = st.none() | st.booleans() | st.integers(-2, 5) | st.sampled_from(["s", "b", "t"])
    values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=10), max_leaves=30)

    @settings(max_examples=300, deadline=None)
    @given(items=st.lists(values, max_size=4), writers=st.integers(-1, 3))
    def check(items, writers):
        with contextlib.suppress(SnapshotError):  # anything else fails the test
            index = parse_index(_with(items=items, writers=writers))
            assert all(0 <= item.writer < index.writers for item in index.items)

    check()


def test_saves_with_dcp_plan_caching_each_name_their_own_step(slot_dir: str) -> None:
    """DefaultSavePlanner(enable_plan_caching=True) hands a save the plan of the one that
    made the cache: its index named that save's step, and every later shard was refused
    at load ('does not match its own index')."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

    for step in range(3):
        saved = _state(step)
        planner = DefaultSavePlanner(enable_plan_caching=True)
        dcp.save(saved, storage_writer=SnapshotWriter(step), planner=planner, no_dist=True)
        _mark_replicated(slot_dir)
    snapshot_api._slots = None  # a restarted worker
    assert restored_step() == 2
    loaded = _state(7)
    dcp.load(loaded, storage_reader=SnapshotReader(), no_dist=True)
    for key in saved["model"]:
        assert torch.equal(loaded["model"][key], saved["model"][key])
    assert loaded["extra"]["epoch"] == 2
