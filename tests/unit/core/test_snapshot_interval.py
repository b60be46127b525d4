"""One snapshot interval for the whole job (issue 35): the pure rules
(core/snapshots/interval.py) and the worker keeping the steps the schedule says."""

from __future__ import annotations

import os

import pytest
import torch

from rtrain.core.snapshots.interval import (
    DEFAULT_LEAD,
    INTERVAL_FILE,
    LOWER_AFTER_S,
    MAX_ENTRIES,
    MAX_INTERVAL,
    Change,
    IndexRate,
    NodeWant,
    Schedule,
    job_interval,
    lead_indices,
    needs_change,
    power_of_two,
)
from rtrain.core.worker import snapshots as snapshot_api
from rtrain.core.worker.snapshots import restore, snapshot

from .test_snapshot_api import _mark_replicated


def test_a_change_starts_aligned_on_both_intervals_a_lead_past_the_steps_reached() -> None:
    schedule = Schedule().then(8, reached=100, lead=10)
    assert schedule.changes == (Change(0, 1), Change(112, 8))  # first multiple of 8 >= 110
    assert [i for i in range(105, 130) if schedule.due(i)] == [
        *range(105, 112),
        112,
        120,
        128,
    ]
    # Shrinking takes twice the lead, aligned on the larger (the old) interval.
    smaller = schedule.then(2, reached=130, lead=10)
    assert smaller.last == Change(152, 2)
    assert smaller.interval_at(151) == 8 and smaller.interval_at(152) == 2
    assert smaller.then(2, 200, 10) is smaller  # no change, no entry
    # Never at or before the last change's start.
    assert Schedule().then(4, reached=0, lead=0).last == Change(4, 4)


def test_every_rank_keeps_the_same_steps_whatever_it_wanted() -> None:
    """Two ranks that wanted 2 and 16 keep exactly the job's steps: the largest k."""
    schedule = Schedule().then(job_interval([2, 16]), reached=40, lead=8)
    kept = [i for i in range(200) if schedule.due(i)]
    assert kept[:48] == list(range(48)) and kept[48:] == list(range(48, 200, 16))


def test_a_schedule_is_checked_before_it_is_used() -> None:
    good = Schedule().then(4, 10, 2).then(1, 40, 2)
    assert Schedule.decode(good.encode()) == good
    for bad in (
        None,
        b"",
        b"{",
        b"[]",
        b'{"a": 1}',
        b"[[0, 3]]",  # no power of two
        b"[[0, 1], [0, 2]]",  # not ascending
        b"[[-1, 1]]",
        b"[[0, 2048]]",
        b"[[0, true]]",
        b"[[0, 1.5]]",
        b"[[0, 1, 2]]",
        b"[" + b"[0, 1], " * 4096 + b"[1, 1]]",
    ):
        assert Schedule.decode(bad) is None, bad
    many = Schedule()
    for n in range(40):
        many = many.then(2 if n % 2 else 4, n * 100, 1)
    assert len(many.changes) == MAX_ENTRIES and Schedule.decode(many.encode()) == many
    assert many.interval_at(many.changes[0].start - 1) == 1  # before the oldest kept


def test_the_job_interval_is_the_largest_any_node_wants() -> None:
    assert job_interval([None, 1, 4, 2]) == 4
    assert job_interval([None, None]) == 1
    assert job_interval([3]) == 4 and power_of_two(5000) == MAX_INTERVAL


def test_who_changes_the_job_interval() -> None:
    assert needs_change(last=2, want=8, previous=2) is True  # above the job's: at once
    assert needs_change(last=8, want=4, previous=2) is False  # still below the job's
    assert needs_change(last=8, want=2, previous=8) is None  # maybe the largest: ask all
    assert needs_change(last=8, want=8, previous=16) is False


def test_a_node_wants_more_at_once_and_less_only_after_a_while() -> None:
    want = NodeWant()
    assert want.observe(1, 0.0) == 1
    assert want.observe(5, 0.1) == 8  # a power of two, at once
    assert want.observe(8, 0.2) is None
    # A wobbling measure costs nothing: below for less than LOWER_AFTER_S, then back.
    assert want.observe(2, 1.0) is None and want.observe(8, 2.0) is None
    assert want.observe(2, 3.0) is None
    assert want.observe(4, 3.0 + LOWER_AFTER_S / 2) is None
    assert want.observe(1, 3.0 + LOWER_AFTER_S) == 4  # the largest wanted meanwhile
    assert want.published == 4


def test_the_lead_is_lead_s_of_steps() -> None:
    assert lead_indices(None) == DEFAULT_LEAD
    assert lead_indices(0.1, lead_s=2.0) == 20
    assert lead_indices(10.0, lead_s=2.0) == 1
    rate = IndexRate()
    for index, now in ((0, 0.0), (4, 0.4), (8, 0.8), (6, 5.0)):
        rate.observe(index, now)
    assert rate.reached == 8 and rate.seconds == pytest.approx(0.1)


def test_a_wait_for_replication_is_not_counted_as_the_steps_time() -> None:
    """Waiting at a due step made the steps look as slow as the replication, so the
    rank never wanted a larger k; the wait is left out of the step time now."""
    from rtrain.core.worker.cadence import Cadence

    cadence = Cadence()
    cadence.observe(0, 0.0)
    cadence.waited(0.2)
    cadence.observe(1, 0.27)
    assert cadence.step_s == pytest.approx(0.07)
    cadence.replicated(0.2)  # 0.25 s of steps needed: 4 of 0.07 s
    assert cadence.interval == 4


def _hand_over(directory: str, schedule: Schedule) -> None:
    path = os.path.join(directory, INTERVAL_FILE)
    with open(path + ".tmp", "wb") as handle:
        handle.write(schedule.encode())
    os.replace(path + ".tmp", path)


def _state(step: int) -> dict:
    return {"w": torch.full((64,), float(step)), "step": step}


def test_with_the_agents_schedule_a_rank_keeps_its_steps_and_waits_for_a_due_one(
    slot_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old adapt policy skipped a due step whose predecessor was unreplicated,
    leaving this rank without a step the others kept; with the job's schedule the rank
    keeps exactly its due steps and waits for the replication instead."""
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "adapt")
    monkeypatch.setattr(snapshot_api, "WAIT_LIMIT_S", 0.2)
    _hand_over(slot_dir, Schedule().then(4, reached=0, lead=8))  # k=4 from step 8
    kept = []
    for step in range(0, 21):
        _mark_replicated(slot_dir)
        if snapshot(_state(step), step):
            kept.append(step)
    assert kept == [*range(8), 8, 12, 16, 20]
    assert snapshot_api._my_slots().job.schedule.last == Change(8, 4)
    # A due step finding the last one unreplicated waits (here past the limit: said).
    with pytest.raises(snapshot_api.SnapshotError, match="not replicated within"):
        snapshot(_state(24), 24)


def test_a_change_learned_late_drops_the_steps_the_job_does_not_keep(
    slot_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "adapt")
    _hand_over(slot_dir, Schedule())
    for step in range(0, 11):  # every step kept, the change to k=8 from 8 not yet known
        assert snapshot(_state(step), step)
        _mark_replicated(slot_dir)
    _hand_over(slot_dir, Schedule((Change(0, 1), Change(8, 8))))
    assert not snapshot(_state(11), 11)
    # Steps 9 and 10 (kept by no other rank) are gone: the newest is step 8, which
    # every rank keeps, and the next due step, 16, does not push it out.
    restored = restore()
    assert restored is not None and restored[1] == 8
    assert snapshot(_state(16), 16)
    assert {s for s in range(17) if _held(slot_dir, s)} >= {8, 16}


def _held(directory: str, step: int) -> bool:
    from rtrain.core.snapshots.format import COMMITTED, read_header

    for path in snapshot_api.slot_paths(directory, 0):
        with open(path, "rb") as handle:
            header = read_header(handle.read(64))
        if header is not None and header.state == COMMITTED and header.step == step:
            return True
    return False


def _run_rank(
    folder: str, monkeypatch: pytest.MonkeyPatch, schedules: dict[int, Schedule]
) -> set[int]:
    """One rank's steps 0..47 in its own slot folder, handed schedules[s] before step s;
    the steps its slots hold at the end."""
    monkeypatch.setenv(snapshot_api.SNAPSHOT_DIR, folder)
    monkeypatch.setattr(snapshot_api, "_slots", None)
    for step in range(48):
        if step in schedules:
            _hand_over(folder, schedules[step])
        _mark_replicated(folder)
        snapshot(_state(step), step)
    return {s for s in range(48) if _held(folder, s)}


def test_a_rank_that_learns_of_a_shrink_late_still_shares_a_step_with_the_others(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k 4 -> 1 from step 40: one rank hands it over at once, the other's agent never
    in time. The late rank holds only multiples of 4; the prompt one, which without a
    guard held 45, 46, 47, keeps its newest multiple of 4 out of the rotation."""
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "adapt")
    monkeypatch.setenv("RANK", "0")
    wide = Schedule().then(4, reached=0, lead=4)
    shrunk = wide.then(1, reached=30, lead=5)
    assert shrunk.last == Change(40, 1) and shrunk.guard() == 4
    (tmp_path / "prompt").mkdir()
    (tmp_path / "late").mkdir()
    prompt = _run_rank(str(tmp_path / "prompt"), monkeypatch, {0: wide, 30: shrunk})
    late = _run_rank(str(tmp_path / "late"), monkeypatch, {0: wide})
    assert late == {36, 40, 44}
    assert prompt == {44, 46, 47}
    assert max(prompt & late) == 44


def test_under_the_job_schedule_one_slow_replica_does_not_raise_k() -> None:
    from rtrain.core.worker.cadence import Cadence

    cadence = Cadence()
    for step in range(3):
        cadence.observe(step, step * 0.1)
    cadence.replicated(0.01, steady=True)
    cadence.replicated(0.5, steady=True)  # one loaded moment
    assert cadence.interval == 1
    cadence.replicated(0.5, steady=True)  # two in a row: slow indeed
    assert cadence.interval == 8
