"""snapshot() / restore() in one worker, with the test playing the agent's part: it
marks each slot replicated, as the replicator does once peers hold the copy."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from rtrain.core.snapshots.format import read_header, set_replicated
from rtrain.core.worker import snapshots as snapshot_api
from rtrain.core.worker.snapshots import restore, slot_paths, snapshot


def _mark_replicated(directory: str) -> None:
    for path in slot_paths(directory, 0):
        if os.path.exists(path):
            with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as buffer:
                header = read_header(buffer)
                if header is not None:
                    set_replicated(buffer, header.step)


def _state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(1000, 100, generator=generator), "step": seed, "tag": f"s{seed}"}


def test_restore_without_rtrain_is_none(monkeypatch) -> None:
    monkeypatch.delenv(snapshot_api.SNAPSHOT_DIR, raising=False)
    monkeypatch.setattr(snapshot_api, "_slots", None)
    assert restore() is None
    assert snapshot({"x": torch.ones(2)}, 1) is False


@pytest.mark.parametrize("copy", [True, False])
def test_restore_returns_the_newest_snapshot(slot_dir: str, copy: bool) -> None:
    for step in (1, 2, 3):
        snapshot(_state(step), step)
        _mark_replicated(slot_dir)
    snapshot_api._slots = None  # a restarted worker
    restored = restore(copy=copy)
    assert restored is not None
    state, step = restored
    assert step == 3 and state["tag"] == "s3" and state["step"] == 3
    assert torch.equal(state["w"], _state(3)["w"])


def test_zero_copy_tensors_survive_later_snapshots_and_writes_stay_private(
    slot_dir: str,
) -> None:
    snapshot(_state(1), 1)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None
    restored = restore(copy=False)
    assert restored is not None
    tensors = restored[0]
    newest = next(p for p in slot_paths(slot_dir, 0) if os.path.exists(p))
    inode = os.stat(newest).st_ino

    tensors["w"].add_(1.0)  # an optimizer updating its restored state in place
    snapshot_api._slots = None
    again = restore(copy=True)
    assert again is not None and torch.equal(again[0]["w"], _state(1)["w"])

    snapshot_api._slots = None
    restore(copy=False)  # pin the slot once more, then keep snapshotting over the slots
    for step in (2, 3, 4):
        snapshot(_state(step), step)
        _mark_replicated(slot_dir)
    assert os.stat(newest).st_ino != inode  # the pinned file was replaced, not written
    assert torch.equal(tensors["w"], _state(1)["w"] + 1.0)
    snapshot_api._slots = None
    latest = restore()
    assert latest is not None and latest[1] == 4


def _slot_bytes(directory: str) -> dict[str, bytes]:
    from pathlib import Path

    return {p: Path(p).read_bytes() for p in slot_paths(directory, 0) if os.path.exists(p)}


@pytest.fixture
def one_rank_group():
    """A real one-rank gloo group, so that real DTensors (as FSDP2 makes) can be built."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # importing DTensor takes two seconds
def test_a_dtensor_comes_back_on_an_equal_mesh_with_its_placements(
    slot_dir: str, one_rank_group
) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    sharded = distribute_tensor(torch.randn(4, 6), one_rank_group, [Shard(1)])
    copied = distribute_tensor(torch.randn(3), one_rank_group, [Replicate()])
    snapshot({"model": {"w": sharded, "b": copied}, "step": 2}, 2)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None
    restored = restore(mesh=one_rank_group)
    assert restored is not None
    state, step = restored
    weight = state["model"]["w"]
    assert step == 2 and isinstance(weight, DTensor)
    assert weight.placements == (Shard(1),) and weight.device_mesh == one_rank_group
    assert torch.equal(weight.to_local(), sharded.to_local())
    assert torch.equal(state["model"]["b"].full_tensor(), copied.full_tensor())
    # Without into= or mesh=, on the unchanged mesh (1-D over the world, FSDP2's): the
    # same, on a mesh over the default group (it was 'no equal mesh', issue 31 item 9)
    alone = restore()
    assert alone is not None
    weight = alone[0]["model"]["w"]
    assert weight.device_mesh == one_rank_group and weight.placements == (Shard(1),)
    assert torch.equal(weight.to_local(), sharded.to_local())
    assert alone[0]["model"]["b"].device_mesh is weight.device_mesh


@pytest.mark.slow  # importing DTensor takes two seconds
def test_a_mesh_rtrain_cannot_make_alone_is_one_line_naming_into(
    slot_dir: str, one_rank_group
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    grid = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    snapshot({"model": {"w": distribute_tensor(torch.randn(4, 6), grid, [Shard(0), Shard(1)])}}, 1)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None
    # refused by key, not a plain tensor passed off as the DTensor; one line, naming into=
    with pytest.raises(
        snapshot_api.SnapshotError, match=r"model\.w: a DTensor saved on a mesh"
    ) as info:
        restore()
    assert "restore(into=...)" in str(info.value) and "\n" not in str(info.value)
    restored = restore(mesh=grid)
    assert restored is not None and restored[0]["model"]["w"].device_mesh == grid


class _ShuffledLoader:
    """A data loader's position, Stateful as torchdata's StatefulDataLoader is."""

    def __init__(self) -> None:
        self.epoch, self.index = 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def _trained(steps: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = _ShuffledLoader()
    for step in range(steps):
        model(torch.full((2, 4), float(step))).sum().backward()
        optimizer.step()
        scheduler.step()
        loader.index += 2
    return {"model": model, "optim": optimizer, "lr": scheduler, "data": loader, "step": steps}


def test_stateful_objects_load_back_in_place(slot_dir: str) -> None:
    trained = _trained(5)
    snapshot(trained, 5)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None
    fresh = _trained(0)
    weight = fresh["model"][0].weight
    restored = restore(into=fresh)
    assert restored is not None and restored[0] is fresh and restored[1] == 5
    assert fresh["model"][0].weight is weight  # loaded into, not replaced
    pairs = zip(fresh["model"].parameters(), trained["model"].parameters(), strict=True)
    assert all(torch.equal(mine, theirs) for mine, theirs in pairs)
    assert str(fresh["optim"].state_dict()) == str(trained["optim"].state_dict())
    assert fresh["lr"].get_last_lr() == trained["lr"].get_last_lr()
    assert (fresh["data"].epoch, fresh["data"].index) == (0, 10) and fresh["step"] == 5


def test_a_tensor_subclass_is_refused_by_key_and_type_before_anything_is_written(
    slot_dir: str,
) -> None:
    class Tagged(torch.Tensor):
        pass

    snapshot(_state(1), 1)
    _mark_replicated(slot_dir)
    before = _slot_bytes(slot_dir)
    state = {"model": {"a": torch.ones(3), "layer.weight": torch.ones(2).as_subclass(Tagged)}}
    with pytest.raises(snapshot_api.SnapshotError) as error:
        snapshot(state, 2)
    assert "model.layer.weight" in str(error.value) and "Tagged" in str(error.value)
    assert _slot_bytes(slot_dir) == before  # nothing was written: the step-1 snapshot is intact
    snapshot_api._slots = None
    restored = restore()
    assert restored is not None and restored[1] == 1


def test_parameters_are_plain_tensors_to_snapshot(slot_dir: str) -> None:
    weight = torch.nn.Parameter(torch.randn(3, 3))
    snapshot({"w": weight}, 1)
    _mark_replicated(slot_dir)
    snapshot_api._slots = None
    restored = restore()
    assert restored is not None and torch.equal(restored[0]["w"], weight.detach())


def test_each_rank_keeps_its_three_newest_steps(slot_dir: str) -> None:
    # Why three: core/snapshots/format.py, SLOTS_PER_RANK. Each snapshot goes to the slot
    # holding the oldest step, so the two steps before the newest stay.
    for step in range(1, 8):
        snapshot(_state(step), step)
        _mark_replicated(slot_dir)
        kept = set()
        for path in slot_paths(slot_dir, 0):
            if os.path.exists(path):
                with open(path, "rb") as handle:
                    header = read_header(handle.read(64))
                if header is not None:
                    kept.add(header.step)
        assert kept == set(range(max(1, step - 2), step + 1))
