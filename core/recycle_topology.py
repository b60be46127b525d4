"""The ReCycle plan a recomputed topology carries to the workers.

With `rtrain launch --recycle-profile FILE`, every generation that lost workers gets
the plan that absorbs the loss: over the previous generation's grid (its DP x PP),
the positions nobody holds any more are the failed workers, and every worker of the
new generation keeps the (replica, stage) it held (or, on a replacement node, the one
it takes over). The agent writes the result next to topology.json, and
`rtrain.core.recycle_actions()` hands each worker its own action list (the format of
`core.pipeline_report.action_list`), for a pipeline runtime to follow.

The profile is a job profile (`PipelineJob.from_profile`) plus "microbatches": the
micro-batches per replica per iteration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from rtrain.core.pipeline_job import PipelineJob, PlannerError, Worker
from rtrain.core.pipeline_plan import NoSurvivor
from rtrain.core.topology import Topology

RECYCLE_PLAN_FILE = "RTRAIN_RECYCLE_PLAN"


def check_profile(profile: Any, pp: int) -> dict[str, Any]:
    """A --recycle-profile as read from its file, for --pp stages; a PlannerError (exit
    64) naming what is wrong."""
    if not isinstance(profile, Mapping):
        raise PlannerError("--recycle-profile: expected a JSON object")
    microbatches = profile.get("microbatches")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise PlannerError("--recycle-profile: microbatches must be a positive integer")
    try:
        PipelineJob.from_profile(_durations(profile), 1, pp, microbatches)
    except PlannerError as exc:
        raise PlannerError(f"--recycle-profile: {exc}") from None
    return dict(profile)


def _durations(profile: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in profile.items() if k != "microbatches"}


def positions(previous: Topology, current: Topology) -> tuple[dict[int, Worker], set[Worker]]:
    """rank of `current` -> its (replica, stage) in `previous`'s grid; and the positions
    of `previous` that no worker of `current` holds (the failed workers)."""
    where: dict[int, Worker] = {}
    for coord in current.coords:
        before = (current.previous_rank or {}).get(coord.rank)
        if before is None:
            before = (current.replaces or {}).get(coord.rank)
        if before is None or before >= len(previous.coords):
            continue
        old = previous.coords[before]
        if old.dp is not None:
            where[coord.rank] = (old.dp, old.pp)
    grid = {(c.dp, c.pp) for c in previous.coords if c.dp is not None}
    return where, grid - set(where.values())


def recycle_plan(
    previous: Topology, current: Topology, profile: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The plan file's content, or None when nothing was lost or no plan can absorb it
    (a stage with no survivor: the shrunk grid is all there is)."""
    from rtrain.core.pipeline_report import action_list
    from rtrain.core.pipeline_scheduler import plan
    from rtrain.core.pipeline_sim import simulate

    where, failed = positions(previous, current)
    if not failed:
        return None
    job = PipelineJob.from_profile(
        _durations(profile),
        previous.dp_size,
        previous.layout.pp,
        int(profile["microbatches"]),
    )
    try:
        chosen = plan(job, sorted(failed), "recycle")
    except NoSurvivor:
        return None
    actions = action_list(chosen, simulate(chosen))
    return {
        "generation": current.generation,
        "positions": {str(rank): list(pos) for rank, pos in sorted(where.items())},
        **actions,
    }


def recycle_actions() -> list[dict[str, Any]] | None:
    """This worker's ReCycle actions for the generation, or None (no plan this time)."""
    path = os.environ.get(RECYCLE_PLAN_FILE)
    if not path:
        return None
    with open(path) as handle:
        data = json.load(handle)
    pos = data["positions"].get(os.environ.get("RANK", "0"))
    if pos is None:
        return None
    for worker in data["workers"]:
        if worker["worker"] == pos:
            return worker["actions"]
    return None
