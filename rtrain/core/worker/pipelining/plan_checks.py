"""What ScheduleReCycle checks before it runs a plan: that there is one, that it
agrees with the stage and the schedule's arguments, and that the backend can carry its
messages."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from ...contract.environment import RTRAIN_GENERATION
from ..recycle import WorkerPlan, recycle_worker_plan
from . import reduction


class PlanMismatch(ValueError):
    """The plan and the stage or the schedule's arguments disagree."""


REBUILD = (
    "under rtrain.repairable, read the plan (recycle_worker_plan()) and build the stage "
    "and the ScheduleReCycle inside the repairable function, anew in each generation"
)


def current_generation() -> int | None:
    """The generation this process runs in under rtrain (a kept worker's changes at each
    repair in place); None elsewhere."""
    found = os.environ.get(RTRAIN_GENERATION, "")
    return int(found) if found.isdigit() else None


def check_generation(made: int | None, what: str) -> None:
    """PlanMismatch if `what` (a plan, a schedule) was made for another generation than
    this one: its plan's positions and its groups are the old generation's."""
    now = current_generation()
    if made is not None and now is not None and made != now:
        raise PlanMismatch(f"{what} generation {made}'s; this is generation {now}: {REBUILD}")


def plan_or_file(plan: WorkerPlan | None) -> WorkerPlan:
    found = plan if plan is not None else recycle_worker_plan()
    if found is None:
        raise PlanMismatch(
            "no ReCycle plan: run under rtrain launch --pp=N --recycle-profile=FILE, or pass plan="
        )
    check_generation(found.generation, "this ReCycle plan is")
    return found


def backend_of(device: torch.device) -> str:
    """The backend the default group uses for `device` ("gloo", "nccl", ...)."""
    name = str(dist.get_backend())
    if ":" not in name:  # one backend for every device
        return name
    per_device = dict(part.split(":", 1) for part in name.split(","))
    return per_device.get(torch.device(device).type, name)


def check_schedule(
    plan: WorkerPlan, stage: PipelineStage, n_microbatches: int, how: str, tagged: bool | None
) -> bool:
    """PlanMismatch unless the schedule can run `plan` on `stage`; whether it sends
    tagged (tagged None: where the backend of the stage's device is gloo)."""
    if plan.position is None:
        raise PlanMismatch(f"rank {plan.rank} holds no position in the ReCycle plan")
    if (stage.stage_index, stage.num_stages) != (plan.position[1], plan.pp):
        raise PlanMismatch(
            f"the stage is {stage.stage_index} of {stage.num_stages}; the plan gives rank "
            f"{plan.rank} stage {plan.position[1]} of {plan.pp}"
        )
    if n_microbatches != plan.microbatches:
        raise PlanMismatch(
            f"n_microbatches={n_microbatches}, the plan was made for {plan.microbatches}"
        )
    if any(len(ranks) != 1 for ranks in plan.holders.values()):
        raise PlanMismatch("ScheduleReCycle runs plans of one rank per position (TP=1)")
    if how not in reduction.REDUCTIONS:
        raise PlanMismatch(f"reduction={how!r}: one of {', '.join(reduction.REDUCTIONS)}")
    if tagged is None:
        tagged = backend_of(stage.device) == "gloo"
    if not tagged and not plan.messages_in_order:
        raise PlanMismatch(
            "this plan has a worker receive a peer's messages in another order than the "
            "peer sends them: untagged (NCCL) it would take one for another; run it over "
            "gloo, which tags them"
        )
    return tagged
