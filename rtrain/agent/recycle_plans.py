"""Each generation's ReCycle plan (`rtrain launch --recycle-profile`).

Every agent computes the same plan from the same memberships, so no plan is sent around.
Only what a plan carries to the next generation (the grid, and which rank holds which
position) is also published in the store, for an agent that was not in the previous
generation (a node that joined late, a replacement): without it, that agent would plan
on another grid than the others, and a runtime following both plans would deadlock.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.config.launch_spec import LaunchSpec
from ..core.contract.environment import RECYCLE_PLAN_FILE
from ..core.layout.recycle import (
    PositionsError,
    decode_positions,
    encode_positions,
    recycle_plan,
    restore_lineage,
)
from ..core.layout.topology import Topology
from ..core.rendezvous.protocol import StoreKeys
from ..core.snapshots.restore_plan import Lineage
from .generation import Generation
from .rendezvous.job import JobRendezvous

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationPlan:
    """What --recycle-profile gives a generation."""

    env: dict[str, str]  # the workers' environment: where their plan file is
    plan: dict[str, Any] | None  # None: no plan (none asked for, or none absorbs the loss)
    lineage: dict[int, Lineage]  # whose state each positioned rank restores


def plan_generation(
    rdzv: JobRendezvous,
    spec: LaunchSpec,
    folder: str,
    topology: Topology,
    before: Topology | None,
    previous: Generation | None,
) -> GenerationPlan:
    """With --recycle-profile, the generation's plan (see write_plan) and the restore
    lineage by plan position; else nothing."""
    if spec.recycle_profile is None:
        return GenerationPlan({}, None, {})
    keys = rdzv.keys
    carried = carried_plan(rdzv, keys, topology.generation, previous)
    env, plan = write_plan(rdzv, keys, folder, topology, spec.recycle_profile, before, carried)
    return GenerationPlan(env, plan, restore_lineage(carried, plan))


def carried_plan(
    rdzv: JobRendezvous, keys: StoreKeys, generation: int, previous: Generation | None
) -> Mapping[str, Any] | None:
    """The previous generation's plan positions: this agent's own if it ran that
    generation, else the ones that generation's agents published."""
    if generation == 0:
        return None
    if previous is not None and previous.number == generation - 1:
        return previous.recycle_plan
    key = keys.recycle_positions(generation - 1)
    payload = rdzv.store.get(key)
    if payload is None:
        return None
    try:
        return decode_positions(payload)
    except PositionsError as exc:
        logger.error("refusing the plan positions of generation %d: %s", generation - 1, exc)
        return None


def write_plan(
    rdzv: JobRendezvous,
    keys: StoreKeys,
    folder: str,
    topology: Topology,
    profile: Mapping[str, Any],
    before: Topology | None,
    carried: Mapping[str, Any] | None,
) -> tuple[dict[str, str], dict[str, Any] | None]:
    """<folder>/recycle_plan.json for rtrain.core.recycle_worker_plan(), its positions
    published for the next generation; the workers' environment, and the plan."""
    generation = topology.generation
    plan = recycle_plan(topology, profile, before, carried)
    if plan is None:
        logger.info("no ReCycle plan for generation %d: a stage lost every worker", generation)
        return {}, None
    rdzv.store.set_once(keys.recycle_positions(generation), encode_positions(plan))
    path = os.path.join(folder, "recycle_plan.json")
    with open(path, "w") as handle:
        json.dump(plan, handle)
    what = f"{len(plan['failed'])} failed worker(s) re-routed" if plan["failed"] else "fault-free"
    logger.info(
        "ReCycle plan for generation %d: %s, iteration %.3g",
        generation,
        what,
        plan["iteration_time"],
    )
    return {RECYCLE_PLAN_FILE: path}, plan
