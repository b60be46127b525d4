"""What the step pays in snapshot() (issue 35 items 1-3): the last layout reused while
the state's structure is unchanged, and only then; the device copier's path on the CPU
(a no-op stream); which steps are kept when replication falls behind (Cadence)."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from rtrain.core.snapshots.format import (
    COMMITTED,
    plan_shard,
    read_shard,
    shard_interval,
    write_shard,
)
from rtrain.core.worker import snapshots as snapshot_api
from rtrain.core.worker.cadence import MAX_INTERVAL, Cadence
from rtrain.core.worker.device_copy import DeviceCopier, NoStream
from rtrain.core.worker.snapshots import restore, snapshot

from .test_snapshot_api import _mark_replicated


def _state(step: int, lr: object = 0.1) -> dict:
    generator = torch.Generator().manual_seed(step)
    weights = OrderedDict(w=torch.randn(64, 8, generator=generator), b=torch.zeros(3))
    return {"model": weights, "opt": {"lr": lr, "betas": (0.9, 0.99)}, "tag": "run", "n": 3}


def _written(layout) -> bytes:
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 5)
    return bytes(buffer)


def test_an_unchanged_structure_reuses_the_skeleton_and_writes_the_same_bytes() -> None:
    first = plan_shard(_state(1))
    second = plan_shard(_state(2), first)
    assert second.meta is first.meta and second.refs is first.refs
    assert _written(second) == _written(plan_shard(_state(2)))
    state, _ = read_shard(bytearray(_written(second)))
    assert torch.equal(state["model"]["w"], _state(2)["model"]["w"])


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (1, True),
        (True, 1),
        (1, 1.0),
        (0.0, -0.0),
        (math.nan, math.nan),
        (0.1, "0.1"),
        (0.1, None),
        (0.1, (0.1,)),
        (0.1, 0.2),
    ],
)
def test_a_plain_value_of_another_type_or_text_never_reuses_the_old_text(
    before: object, after: object
) -> None:
    first = plan_shard(_state(1, lr=before))
    second = plan_shard(_state(2, lr=after), first)
    assert second.meta == plan_shard(_state(2, lr=after)).meta  # what a fresh plan writes
    state, _ = read_shard(bytearray(_written(second)))
    got = state["opt"]["lr"]
    assert type(got) is type(after) and repr(got) == repr(after)


def test_a_tensor_of_another_shape_or_dtype_lays_the_state_out_again() -> None:
    first = plan_shard(_state(1))
    for change in (torch.zeros(4), torch.zeros(3, dtype=torch.float64)):
        state = _state(2)
        state["model"]["b"] = change
        again = plan_shard(state, first)
        assert again.meta != first.meta
        restored, _ = read_shard(bytearray(_written(again)))
        assert torch.equal(restored["model"]["b"], change)
        assert restored["model"]["b"].dtype == change.dtype


def test_snapshot_copies_through_the_device_copier_with_a_no_op_stream_on_the_cpu(
    slot_dir: str,
) -> None:
    for step in range(3):
        assert snapshot(_state(step), step)
        _mark_replicated(slot_dir)
    slots = snapshot_api._my_slots()
    assert slots is not None
    for slot in slots.slots:
        assert isinstance(slot.copier, DeviceCopier) and isinstance(slot.copier.stream, NoStream)
        assert slot.copier.device_copies == 0  # host tensors: copied inline
        assert slot.views  # the views into the slot were kept for the next write
    restored = restore()
    assert restored is not None and restored[1] == 2
    assert torch.equal(restored[0]["model"]["w"], _state(2)["model"]["w"])


def test_the_copier_finishes_before_the_commit_and_a_cpu_finish_waits_for_nothing() -> None:
    finished: list[bool] = []

    class Watching(DeviceCopier):
        def finish(self) -> None:
            finished.append(buffer[12] == COMMITTED)
            super().finish()

    layout = plan_shard(_state(3))
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 3, 4, {}, Watching())
    assert finished == [False]  # finish() ran before the commit write
    assert shard_interval(buffer) == 4
    state, step = read_shard(buffer)
    assert step == 3 and torch.equal(state["model"]["w"], _state(3)["model"]["w"])


def test_the_interval_doubles_when_behind_and_keeps_aligned_steps() -> None:
    cadence = Cadence()
    for step in range(4):
        cadence.observe(step, step * 0.1)
    assert cadence.due(3)
    cadence.behind(0.05)
    assert cadence.interval == 2
    assert [s for s in range(4, 12) if cadence.due(s)] == [4, 6, 8, 10]
    cadence.behind(1.0)  # a second behind at 0.1 s a step: 1.25 s / 0.1 -> 16
    assert cadence.interval == 16
    for _ in range(20):
        cadence.behind(1e9)
    assert cadence.interval == MAX_INTERVAL


def test_the_interval_follows_the_measured_replication_time() -> None:
    cadence = Cadence()
    for step in range(0, 40, 10):  # every 10th step is snapshotted, 0.1 s apart
        cadence.observe(step, step / 100)
    assert cadence.due(30) and cadence.due(40)  # every call is due at an interval of 1
    cadence.replicated(0.7)  # 0.875 s of steps needed: 9 -> 16
    assert cadence.interval == 16
    assert cadence.due(160) and not cadence.due(150)
    cadence.replicated(0.01)  # caught up: back to every step at once
    assert cadence.interval == 1
    cadence.replicated(0.0)  # not known: unchanged
    assert cadence.interval == 1


def test_a_snapshot_that_finds_the_last_one_unreplicated_skips_the_step(
    slot_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "adapt")
    assert snapshot(_state(0), 0)
    _mark_replicated(slot_dir)
    assert snapshot(_state(1), 1)
    # Not replicated: the step is skipped at once (the old policy waited for it).
    assert not snapshot(_state(2), 2)
    slots = snapshot_api._my_slots()
    assert slots is not None and slots.cadence.interval >= 2
    _mark_replicated(slot_dir)
    # The next due step is kept; the one after finds it unreplicated and is skipped.
    kept = [step for step in range(3, 40) if snapshot(_state(step), step)]
    assert len(kept) == 1 and kept[0] % 2 == 0
    restored = restore()
    assert restored is not None and restored[1] == kept[0]


def test_adapt_is_the_default_and_waits_without_the_agents_schedule_and_a_bad_one_is_one_line(
    slot_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_api, "WAIT_LIMIT_S", 0.2)
    assert snapshot_api._my_slots().adapt  # the default (issue 35): the job-wide k
    assert snapshot(_state(0), 0)
    with pytest.raises(snapshot_api.SnapshotError, match="not replicated within"):
        snapshot(_state(1), 1)  # no schedule from an agent: waits, as wait does
    for policy in ("wait", "adapt"):
        monkeypatch.setattr(snapshot_api, "_slots", None)
        monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, policy)
        slots = snapshot_api._my_slots()
        assert slots is not None and slots.adapt is (policy == "adapt")
    monkeypatch.setattr(snapshot_api, "_slots", None)
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "skip")
    with pytest.raises(snapshot_api.SnapshotError, match="one of wait, adapt"):
        snapshot(_state(1), 1)


def _many(step: int) -> dict:
    """Host tensors of several dtypes, a non-contiguous one and an empty one among them."""
    generator = torch.Generator().manual_seed(step)
    wide = torch.randn(6, 10, generator=generator)
    return {
        "w": [torch.randn(5, 7, generator=generator) for _ in range(4)],
        "t": wide.t(),  # strided: copied by copy_'s own rules
        "none": torch.zeros(0, 3),
        "i": torch.arange(7, dtype=torch.int64) * step,
        "h": torch.randn(9, generator=generator).to(torch.bfloat16),
        "steps": [2, True, 3],
    }


def test_host_tensors_go_in_one_batched_copy_into_views_listed_once() -> None:
    calls: list[tuple[int, int]] = []

    class Counting(DeviceCopier):
        def copy_host(self, targets: list, sources: list) -> None:
            calls.append((id(targets), len(targets)))
            super().copy_host(targets, sources)

        def copy(self, target: object, source: object) -> None:
            raise AssertionError("host tensors go in one batched copy")

    views: dict = {}
    copier = Counting()
    layout = plan_shard(_many(1))
    assert layout.on_host
    buffer = bytearray(layout.size)
    for step in (1, 2, 3):
        layout = plan_shard(_many(step), layout)
        write_shard(buffer, layout, step, 0, views, copier)
        state, _ = read_shard(buffer)
        expected = _many(step)
        for key in ("t", "none", "i", "h"):
            assert (
                torch.equal(state[key], expected[key]) and state[key].dtype == expected[key].dtype
            )
        assert all(torch.equal(a, b) for a, b in zip(state["w"], expected["w"], strict=True))
        looped = bytearray(layout.size)
        write_shard(looped, plan_shard(_many(step)), step)  # the plain loop of copy_
        assert buffer == looped
    # one call a write, the empty tensor left out, the same list of views every time
    assert [n for _, n in calls] == [7, 7, 7] and len({i for i, _ in calls}) == 1


def test_the_batched_copy_equals_a_loop_of_copy_and_falls_back_to_it_before_2_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rtrain.core.worker import device_copy

    sources = [torch.randn(3, 4).t(), torch.arange(5), torch.randn(2, 2).to(torch.float16)]
    installed = torch.__version__
    for version in (installed, "2.0.1"):
        monkeypatch.setattr(torch, "__version__", version)
        assert (device_copy._foreach_copy() is not None) == (version == installed)
        targets = [torch.empty(s.shape, dtype=s.dtype) for s in sources]
        with torch.no_grad():
            device_copy.copy_all(targets, sources)
        assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))


def test_changed_plain_values_keep_the_offsets_and_write_what_a_fresh_plan_holds() -> None:
    """A step count, a scheduler's learning rate and a string that change every step
    (or grow: more digits, a longer repr) are put into the last skeleton's text; the
    tensors keep their offsets. Before, any such change laid the whole state out again
    (about 9 us a tensor)."""
    first = plan_shard(_state(1, lr=0.1))
    for step, lr in ((2, 0.0999), (3, 0.09876543210987654), (4, -0.0), (5, math.inf)):
        state = _state(step, lr=lr)
        state["n"], state["tag"] = 10**step, f"run-{step}" * step
        again = plan_shard(state, first)
        assert again.refs is first.refs and len(again.meta) == len(first.meta)
        restored, _ = read_shard(bytearray(_written(again)))
        fresh, _ = read_shard(bytearray(_written(plan_shard(state))))
        assert repr(restored["opt"]["lr"]) == repr(lr) and restored["n"] == 10**step
        assert restored["tag"] == state["tag"] and torch.equal(
            restored["model"]["w"], state["model"]["w"]
        )
        assert repr(restored) == repr(fresh)
        first = again


def test_values_that_outgrow_the_skeletons_room_lay_the_state_out_again() -> None:
    first = plan_shard(_state(1))
    state = _state(2)
    state["tag"] = "x" * (len(first.meta) + 1)
    again = plan_shard(state, first)
    assert again.refs is not first.refs and len(again.meta) > len(first.meta)
    restored, _ = read_shard(bytearray(_written(again)))
    assert restored["tag"] == state["tag"]


def test_a_string_holding_the_templates_stand_in_still_writes_the_right_skeleton() -> None:
    stand_in = "\ue000"
    state = _state(1)
    state["tag"], state[stand_in] = stand_in, [stand_in, 'x"' + stand_in]
    first = plan_shard(state)
    assert first.template is None  # ambiguous: no template, and the text is still right
    restored, _ = read_shard(bytearray(_written(first)))
    assert restored["tag"] == stand_in and restored[stand_in] == state[stand_in]
    later = _state(2)
    later["tag"], later[stand_in] = "other", ["a", "b"]
    again = plan_shard(later, first)
    restored, _ = read_shard(bytearray(_written(again)))
    assert restored["tag"] == "other" and restored[stand_in] == ["a", "b"]


def test_ints_and_bools_in_a_list_are_not_one_value_to_the_reused_layout() -> None:
    first = plan_shard({"w": torch.zeros(2), "n": [1, True, "a", None]})
    again = plan_shard({"w": torch.ones(2), "n": [True, 1, "a", None]}, first)
    assert again.meta != first.meta
    state, _ = read_shard(bytearray(_written(again)))
    assert [type(v) for v in state["n"]] == [bool, int, str, type(None)]


def test_state_of_keeps_tensors_and_plain_values_and_takes_every_stateful_s_dict() -> None:
    from rtrain.core.worker.stateful import state_of

    weight = torch.nn.Parameter(torch.ones(2))
    module = torch.nn.Linear(2, 2)
    tensor = torch.zeros(3)
    state = {"t": tensor, "p": weight, "v": [1, 2.0, "x", None, b"y", True], "m": (module,)}
    got = state_of(state)
    assert got["t"] is tensor and got["p"] is weight and got["v"] == state["v"]
    assert isinstance(got["m"], tuple) and set(got["m"][0]) == {"weight", "bias"}
    assert got is not state and got["v"] is not state["v"]  # the containers are new
