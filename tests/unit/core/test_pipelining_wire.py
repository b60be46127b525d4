"""The header every activation travels behind (core/worker/pipelining/wire.py), and what
ScheduleReCycle refuses before it sends anything."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rtrain.core.layout.recycle import failure_plan
from rtrain.core.planner.job import PipelineJob
from rtrain.core.planner.report import disordered_pairs
from rtrain.core.worker.pipelining import PlanMismatch, ScheduleReCycle, WireError, plan_checks
from rtrain.core.worker.pipelining.plan_checks import check_schedule
from rtrain.core.worker.pipelining.wire import (
    DTYPES,
    HEADER_LEN,
    MAX_BYTES,
    header_of,
    parse_header,
)
from rtrain.core.worker.recycle import worker_plan

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    st.sampled_from(DTYPES),
    st.lists(st.integers(min_value=0, max_value=64), min_size=0, max_size=8),
)
def test_a_header_round_trips(dtype: torch.dtype, shape: list[int]) -> None:
    tensor = torch.empty(shape, dtype=dtype, device="meta")  # a shape, no memory
    if tensor.numel() * tensor.element_size() > MAX_BYTES:  # refused by the sender too
        with pytest.raises(WireError, match="cannot send a"):
            header_of(tensor)
        return
    assert parse_header(header_of(tensor), 3) == (dtype, tuple(shape))


@given(st.lists(INT64, min_size=HEADER_LEN, max_size=HEADER_LEN))
def test_any_header_a_peer_sends_is_parsed_or_refused_by_name(values: list[int]) -> None:
    try:
        dtype, shape = parse_header(torch.tensor(values, dtype=torch.int64), 7)
    except WireError as exc:
        assert "rank 7" in str(exc)
        return
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    assert len(shape) <= 8 and all(d >= 0 for d in shape) and size <= MAX_BYTES


def test_a_header_asking_for_a_huge_tensor_is_refused_before_allocating() -> None:
    header = header_of(torch.zeros(2, 2))
    header[2:4] = 1 << 20  # 2^40 floats
    with pytest.raises(WireError, match="rank 1 announced a 4398046511104-byte tensor"):
        parse_header(header, 1)


def test_tensors_the_wire_does_not_carry_are_refused_by_dtype_and_rank() -> None:
    with pytest.raises(WireError, match="complex64"):
        header_of(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(WireError, match="9 dimensions"):
        header_of(torch.zeros([1] * 9))


class FakeStage:
    """The attributes ScheduleReCycle reads of a PipelineStage, before any group exists."""

    def __init__(self, index: int, count: int) -> None:
        self.stage_index, self.num_stages = index, count
        self.submod = torch.nn.Linear(2, 2)


PLAN = worker_plan(failure_plan(PipelineJob.uniform(2, 2, 4), [(1, 1)]), 1)  # (0, 1)


@pytest.mark.parametrize(
    ("stage", "microbatches", "reduction", "fragment"),
    [
        (FakeStage(0, 2), 4, "exact", "the stage is 0 of 2; the plan gives rank 1 stage 1 of 2"),
        (FakeStage(1, 3), 4, "exact", "the stage is 1 of 3"),
        (FakeStage(1, 2), 8, "exact", "n_microbatches=8, the plan was made for 4"),
        (FakeStage(1, 2), 4, "mean", "reduction='mean': one of exact, sum"),
    ],
)
def test_a_schedule_that_disagrees_with_its_plan_is_refused(
    stage: FakeStage, microbatches: int, reduction: str, fragment: str
) -> None:
    with pytest.raises(PlanMismatch, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        ScheduleReCycle(stage, microbatches, plan=PLAN, reduction=reduction)  # type: ignore[arg-type]


def test_a_rank_without_a_position_or_a_plan_is_refused(monkeypatch) -> None:
    spare = worker_plan(failure_plan(PipelineJob.uniform(2, 2, 4), [(1, 1)]), 5)
    with pytest.raises(PlanMismatch, match="rank 5 holds no position"):
        ScheduleReCycle(FakeStage(0, 2), 4, plan=spare)  # type: ignore[arg-type]
    monkeypatch.delenv("RTRAIN_RECYCLE_PLAN", raising=False)
    with pytest.raises(PlanMismatch, match="no ReCycle plan: run under rtrain launch"):
        ScheduleReCycle(FakeStage(0, 2), 4)  # type: ignore[arg-type]


def _crossed(data: dict) -> dict:
    """`data` with the worker at (0, 1) taking its first two activations from (0, 0) in
    the other order than (0, 0) sends them."""
    crossed = copy.deepcopy(data)
    worker = next(w for w in crossed["workers"] if w["worker"] == [0, 1])
    actions = worker["actions"]
    first, second = [
        i
        for i, a in enumerate(actions)
        if a["op"] == "F" and a["iteration"] == 0 and a["recv_from"] == [0, 0]
    ][:2]
    actions[first], actions[second] = actions[second], actions[first]
    return crossed


def test_a_plan_whose_messages_cross_is_run_tagged_only() -> None:
    data = failure_plan(PipelineJob.uniform(2, 2, 4), [(1, 1)])
    assert disordered_pairs(data) == [] and PLAN.messages_in_order
    crossed = _crossed(data)
    assert disordered_pairs(crossed) == [((0, 0), (0, 1))]
    plan = worker_plan(crossed, 1)  # the worker at (0, 1)
    assert not plan.messages_in_order
    with pytest.raises(PlanMismatch, match="untagged \\(NCCL\\) it would take one for another"):
        ScheduleReCycle(FakeStage(1, 2), 4, plan=plan, tagged=False)  # type: ignore[arg-type]
    check_schedule(plan, FakeStage(1, 2), 4, "exact", tagged=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dp", "pp", "failed"),
    [
        (2, 2, []),
        (2, 2, [(1, 1)]),
        (2, 3, [(0, 1)]),
        (3, 2, [(1, 0), (2, 1)]),
        (4, 4, [(1, 2), (3, 0)]),
        (8, 4, [(0, 0), (3, 1), (5, 3)]),
    ],
)
def test_the_planner_s_plans_keep_every_pair_s_messages_in_order(
    dp: int, pp: int, failed: list[tuple[int, int]]
) -> None:
    """The jobs the tests, the example and the benchmarks run (and two larger): each can
    run untagged. Not a guarantee of the list scheduler; the schedule checks each plan."""
    for profile in ((1.0, 1.0, 1.0, 0.2, 0.05), (0.04, 0.04, 0.04, 0.02, 0.002)):
        for schedule in ("recycle", "drop") if failed else ("1f1b", "recycle"):
            data = failure_plan(PipelineJob.uniform(dp, pp, 4, *profile), failed, schedule)
            assert disordered_pairs(data) == [], (schedule, profile)


@pytest.mark.parametrize(
    ("backend", "device", "found"),
    [
        ("gloo", "cpu", "gloo"),
        ("nccl", "cuda", "nccl"),
        ("cpu:gloo,cuda:nccl", "cpu", "gloo"),
        ("cpu:gloo,cuda:nccl", "cuda", "nccl"),
    ],
)
def test_tags_follow_the_backend_of_the_stage_s_device(
    monkeypatch: pytest.MonkeyPatch, backend: str, device: str, found: str
) -> None:
    monkeypatch.setattr(plan_checks.dist, "get_backend", lambda group=None: backend)
    assert plan_checks.backend_of(torch.device(device)) == found
