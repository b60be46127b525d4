"""recycle_worker_plan() and recycle_actions(): a worker's part of its generation's
ReCycle plan, read from the file the agent wrote (core/layout/recycle.py makes it).

worker_plan() reads the same content from memory: a benchmark or a test that plans a
failure set itself (core.layout.recycle.failure_plan) hands each rank its part that way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..contract.environment import RECYCLE_PLAN_FILE
from ..planner.job import Worker


@dataclass(frozen=True)
class WorkerPlan:
    """One worker's view of its generation's ReCycle plan."""

    rank: int
    position: Worker | None  # (replica, stage) on the plan's grid; None: no part in it
    actions: list[dict[str, Any]]  # this worker's, in order (core.planner.report format)
    holders: dict[Worker, tuple[int, ...]]  # the ranks at each position (TP > 1: several)
    dp: int
    pp: int
    microbatches: int
    failed: list[Worker]
    # Whether every worker receives its peers' messages in the order they send them
    # (core.planner.report.disordered_pairs): what a backend without tags needs.
    messages_in_order: bool = True
    # The generation the agent planned it for (recycle_worker_plan()); None: a plan made
    # otherwise (worker_plan() of a test's or a benchmark's own failure set).
    generation: int | None = None

    @property
    def stage(self) -> int | None:
        return None if self.position is None else self.position[1]

    @property
    def replica(self) -> int | None:
        """The replica whose data this worker loads (its own micro-batches' source)."""
        return None if self.position is None else self.position[0]


def worker_plan(data: Mapping[str, Any], rank: int) -> WorkerPlan:
    """Rank `rank`'s part of a plan file's content."""
    # here, not at the top: `import rtrain` in every worker need not load the planner
    from ..planner.report import disordered_pairs

    holders: dict[Worker, list[int]] = {}
    for other, pos in data["positions"].items():
        holders.setdefault((int(pos[0]), int(pos[1])), []).append(int(other))
    mine = data["positions"].get(str(rank))
    position = (int(mine[0]), int(mine[1])) if mine is not None else None
    actions: list[dict[str, Any]] = []
    for worker in data["workers"]:
        if position is not None and tuple(worker["worker"]) == position:
            actions = worker["actions"]
    return WorkerPlan(
        rank=rank,
        position=position,
        actions=actions,
        holders={pos: tuple(sorted(ranks)) for pos, ranks in holders.items()},
        dp=int(data["dp"]),
        pp=int(data["pp"]),
        microbatches=int(data["microbatches"]),
        failed=[(int(r), int(s)) for r, s in data["failed"]],
        messages_in_order=not disordered_pairs(data),
    )


def recycle_worker_plan() -> WorkerPlan | None:
    """This worker's part of the generation's plan, or None (no --recycle-profile, or no
    plan could absorb the loss). Read at each call: under rtrain.repairable, call it
    inside the repairable function, once per generation."""
    path = os.environ.get(RECYCLE_PLAN_FILE)
    if not path:
        return None
    with open(path) as handle:
        data = json.load(handle)
    plan = worker_plan(data, int(os.environ.get("RANK", "0")))
    return replace(plan, generation=int(data["generation"]))


def recycle_actions() -> list[dict[str, Any]] | None:
    """This worker's ReCycle actions for the generation, or None (no plan this time)."""
    plan = recycle_worker_plan()
    if plan is None or plan.position is None:
        return None
    return plan.actions
