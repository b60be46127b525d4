"""A kept worker (rtrain.repairable) moves to the next generation in the same process:
a ReCycle plan read, or a ScheduleReCycle built, in an earlier generation carries that
generation's positions and groups, and is refused by name instead of run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rtrain.core.layout.recycle import failure_plan
from rtrain.core.planner.job import PipelineJob
from rtrain.core.worker.pipelining import PlanMismatch, ScheduleReCycle
from rtrain.core.worker.recycle import recycle_worker_plan, worker_plan


class FakeStage:
    """The attributes ScheduleReCycle reads of a PipelineStage, before any group exists."""

    def __init__(self, index: int, count: int) -> None:
        self.stage_index, self.num_stages = index, count
        self.submod = torch.nn.Linear(2, 2)
        self.is_first, self.is_last = index == 0, index == count - 1
        self.device = torch.device("cpu")


def _agent_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generation: int) -> None:
    """The plan file the agent writes for `generation` (one replica: no stage group)."""
    data = {**failure_plan(PipelineJob.uniform(1, 2, 4), []), "generation": generation}
    path = tmp_path / f"plan{generation}.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("RTRAIN_RECYCLE_PLAN", str(path))
    monkeypatch.setenv("RTRAIN_GENERATION", str(generation))
    monkeypatch.setenv("RANK", "0")


def test_the_agents_plan_says_its_generation(tmp_path: Path, monkeypatch) -> None:
    _agent_plan(tmp_path, monkeypatch, 3)
    plan = recycle_worker_plan()
    assert plan is not None and plan.generation == 3 and plan.position == (0, 0)
    # a plan made otherwise (a test's, a benchmark's) belongs to no generation
    assert worker_plan(failure_plan(PipelineJob.uniform(1, 2, 4), []), 0).generation is None


def test_a_plan_read_in_an_earlier_generation_is_refused(tmp_path: Path, monkeypatch) -> None:
    _agent_plan(tmp_path, monkeypatch, 0)
    old = recycle_worker_plan()
    _agent_plan(tmp_path, monkeypatch, 1)  # repaired in place: the next generation
    with pytest.raises(PlanMismatch, match="plan is generation 0's; this is generation 1"):
        ScheduleReCycle(FakeStage(0, 2), 4, plan=old, tagged=True)  # type: ignore[arg-type]
    ScheduleReCycle(FakeStage(0, 2), 4, plan=recycle_worker_plan(), tagged=True)  # type: ignore[arg-type]


def test_a_schedule_built_in_an_earlier_generation_is_refused(tmp_path: Path, monkeypatch) -> None:
    _agent_plan(tmp_path, monkeypatch, 0)
    schedule = ScheduleReCycle(FakeStage(0, 2), 4, tagged=True)  # type: ignore[arg-type]
    _agent_plan(tmp_path, monkeypatch, 1)
    with pytest.raises(PlanMismatch, match="inside the repairable function"):
        schedule.step(torch.zeros(4, 2))


def test_outside_rtrain_no_generation_is_checked(tmp_path: Path, monkeypatch) -> None:
    _agent_plan(tmp_path, monkeypatch, 2)
    monkeypatch.delenv("RTRAIN_GENERATION")  # a plan file read under another launcher
    schedule = ScheduleReCycle(FakeStage(0, 2), 4, tagged=True)  # type: ignore[arg-type]
    assert schedule.plan.generation == 2  # the file's plan, taken as it is
    assert schedule._generation is None  # made in no generation: step() refuses none
