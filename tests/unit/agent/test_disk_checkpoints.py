"""Disk checkpoints are trusted only when this job wrote them: a shared folder that
others can write must not become training state (agent/snapshots/disk/checkpoints.py);
and a full disk leaves nothing behind, old steps are pruned."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.disk.checkpoints import (
    KEY_FILE,
    CheckpointDir,
    DiskCheckpointer,
    load_verified,
    newest_complete,
    open_checkpoint_dir,
    prune_checkpoints,
    write_checkpoint,
)
from rtrain.agent.waiting import SYSTEM_CLOCK
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


SECRET = b"the job secret, sixteen bytes+"


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted at the end."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)])
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_full_disk_leaves_nothing_behind_and_says_so_once_per_streak(full_disk, caplog):
    directory = open_checkpoint_dir(str(full_disk), SECRET)
    write_step(directory, 1, world=1)
    checkpointer = DiskCheckpointer(directory, every=1, keep=1)
    big = bytes(2 << 20)  # more than the disk holds: ENOSPC
    with caplog.at_level(logging.INFO, logger="rtrain.agent.snapshots.disk.checkpoints"):
        for step in range(2, 7):
            checkpointer.offer(0, step, 1, big, checksums(big, len(big)))
            assert SYSTEM_CLOCK.wait_until(lambda: not checkpointer._pending, 30, 0.01)
            # each failure removed its files: the complete step 1 is all there is
            assert files_under(full_disk) == [
                "step-000000001",
                "step-000000001/rank-0.json",
                "step-000000001/rank-0.shard",
            ]
            assert newest_complete(directory) == (1, 1)
        small = shard_bytes(7.0, 7)
        checkpointer.offer(0, 7, 1, small, checksums(small, len(small)))
        checkpointer.close()
    said = [r.getMessage() for r in caplog.records]
    failed = [m for m in said if "failed" in m and "step" in m]
    assert len(failed) == 2, said  # the streak's first, then its count when one succeeded
    assert "rank 0 step 2 failed" in failed[0] and "after 5 failed" in failed[1]
    # step 7 written, step 1 pruned (keep=1), nothing else
    assert files_under(full_disk) == [
        "step-000000007",
        "step-000000007/rank-0.json",
        "step-000000007/rank-0.shard",
    ]
    assert read_shard(bytearray(load_verified(directory, 7, 0)))[1] == 7


def test_a_rewrite_that_fails_leaves_no_new_shard_under_the_old_manifest(tmp_path) -> None:
    directory = open_checkpoint_dir(str(tmp_path), SECRET)
    write_step(directory, 2)
    write_step(directory, 3)
    # step 3 rewritten with other bytes (a restarted job reaching it again), its
    # manifest cannot be written (a real OS error: its temporary name is a folder)
    (tmp_path / "step-000000003" / "rank-0.json.tmp").mkdir()
    data = shard_bytes(5.0, 3)
    with pytest.raises(OSError):
        write_checkpoint(directory, 0, 3, 2, data, checksums(data, len(data)))
    step, world = newest_complete(directory)
    for rank in range(world):  # whatever is complete reads back as it was signed
        load_verified(directory, step, rank)
    assert step == 2 and not (tmp_path / "step-000000003" / "rank-0.shard").exists()


def test_the_same_bytes_again_are_not_rewritten(tmp_path) -> None:
    directory = open_checkpoint_dir(str(tmp_path), SECRET)
    write_step(directory, 4)
    shard = tmp_path / "step-000000004" / "rank-1.shard"
    before = shard.stat().st_ino
    write_step(directory, 4)
    assert shard.stat().st_ino == before and newest_complete(directory) == (4, 2)


def test_old_steps_are_pruned_to_the_newest_complete_ones(tmp_path) -> None:
    directory = open_checkpoint_dir(str(tmp_path), SECRET)
    for step in (1, 2, 3, 5, 6):
        write_step(directory, step)
    (tmp_path / "step-000000000").mkdir()  # an empty folder, older
    data = shard_bytes(1.0, 4)  # step 4 and step 7: incomplete (rank 1 missing)
    for step in (4, 7):
        write_checkpoint(directory, 0, step, 2, data, checksums(data, len(data)))
    assert prune_checkpoints(directory, 2) == [4, 3, 2, 1, 0]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-000000005",
        "step-000000006",
        "step-000000007",  # newer than the kept ones: being written
    ]
    assert newest_complete(directory) == (6, 2)


def test_saving_the_slots_at_once_writes_the_newest_step_each_rank_committed(tmp_path):
    # The save before a Slurm stop (SnapshotService.save_to_disk, disk/save.py): every
    # committed slot of the generation goes, a slot whose header does not fit does not.
    from rtrain.agent.snapshots.disk.save import save_slots
    from rtrain.agent.snapshots.shard_store import ShardStore
    from rtrain.core.worker.snapshots import slot_paths

    store = ShardStore(str(tmp_path / "shm"), budget=0)
    for rank in range(2):
        for path, step in zip(slot_paths(store.snap_dir(3), rank), (6, 7), strict=False):
            Path(path).write_bytes(shard_bytes(rank + step / 10, step))
    Path(slot_paths(store.snap_dir(3), 1)[2]).write_bytes(b"\x00" * 100)  # no header
    directory = open_checkpoint_dir(str(tmp_path / "ckpt"), b"secret")
    assert save_slots(store, directory, 3, 2) == 7
    assert newest_complete(directory) == (7, 2)
    assert load_verified(directory, 7, 1) == shard_bytes(1.7, 7)
