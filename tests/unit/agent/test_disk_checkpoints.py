"""Disk checkpoints are trusted only when this job wrote them: a shared folder that
others can write must not become training state (agent/snapshots/disk_checkpoints.py)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.disk_checkpoints import (
    KEY_FILE,
    CheckpointDir,
    load_verified,
    newest_complete,
    open_checkpoint_dir,
    write_checkpoint,
)
from rtrain.core.errors import UsageError
from rtrain.core.snapshots.format import plan_shard, read_shard, write_shard


def shard_bytes(value: float, step: int) -> bytes:
    layout = plan_shard({"w": torch.full((64,), value)})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return bytes(buffer)


def write_step(directory: CheckpointDir, step: int, world: int = 2) -> None:
    for rank in range(world):
        data = shard_bytes(float(rank), step)
        write_checkpoint(directory, rank, step, world, data, checksums(data, len(data)))


def test_the_job_reads_back_what_it_wrote(tmp_path) -> None:
    directory = open_checkpoint_dir(str(tmp_path), None)
    write_step(directory, 5)
    write_step(directory, 10)
    assert newest_complete(directory) == (10, 2)
    state, step = read_shard(bytearray(load_verified(directory, 10, 1)))
    assert step == 10 and torch.equal(state["w"], torch.full((64,), 1.0))
    # A relaunch without a secret finds the folder's key and trusts the same files.
    again = open_checkpoint_dir(str(tmp_path), None)
    assert again.key == directory.key and newest_complete(again) == (10, 2)
    assert oct(os.stat(tmp_path / KEY_FILE).st_mode & 0o777) == "0o600"


def test_a_checkpoint_another_key_signed_is_passed_over(tmp_path) -> None:
    ours = open_checkpoint_dir(str(tmp_path), b"the job secret, sixteen bytes+")
    write_step(ours, 5)
    # Someone who can write the folder but has not the key plants a newer step: it
    # looks complete and well formed, and is refused by its MAC.
    write_step(CheckpointDir(str(tmp_path), b"some other key, sixteen bytes"), 20)
    assert newest_complete(ours) == (5, 2)
    with pytest.raises(ValueError, match="not written by this job"):
        load_verified(ours, 20, 0)


def test_a_planted_manifest_without_a_mac_and_a_replayed_one_are_refused(tmp_path) -> None:
    ours = open_checkpoint_dir(str(tmp_path), b"the job secret, sixteen bytes+")
    write_step(ours, 5)
    # The pre-HMAC manifest format, with valid checksums of a planted shard.
    planted = tmp_path / "step-000000030"
    planted.mkdir()
    data = shard_bytes(9.0, 30)
    (planted / "rank-0.shard").write_bytes(data)
    (planted / "rank-0.json").write_text(
        json.dumps({"world_size": 1, "crcs": checksums(data, len(data))})
    )
    # A genuine step copied under a newer name: its signed step gives it away.
    shutil.copytree(tmp_path / "step-000000005", tmp_path / "step-000000040")
    assert newest_complete(ours) == (5, 2)
    for step in (30, 40):
        with pytest.raises(ValueError, match="refused"):
            load_verified(ours, step, 0)


def test_a_flipped_byte_in_a_shard_is_refused(tmp_path) -> None:
    ours = open_checkpoint_dir(str(tmp_path), None)
    write_step(ours, 5)
    path = tmp_path / "step-000000005" / "rank-1.shard"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not the shard its manifest signs"):
        load_verified(ours, 5, 1)


def test_a_key_file_others_can_read_is_a_usage_error(tmp_path) -> None:
    open_checkpoint_dir(str(tmp_path), None)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(UsageError, match="only this user can read"):
        open_checkpoint_dir(str(tmp_path), None)
