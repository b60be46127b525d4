"""The ReCycle plan a recomputed topology carries to the workers.

With `rtrain launch --recycle-profile FILE`, every generation gets a plan: generation
0 the fault-free one, and a generation that lost workers the plan that absorbs the
loss. Every worker keeps the (replica, stage) it held (or, on a replacement node, the
one it takes over) on the grid of the first generation, and the positions nobody holds
any more are the failed workers. The agent writes the result next to topology.json, and
`rtrain.core.recycle_actions()`
(core/worker/recycle.py) hands each worker its own action list (the format of
`core.planner.report.action_list`), for a pipeline runtime to follow
(rtrain.core.worker.pipelining.ScheduleReCycle).

A rank with no position (a node that joined after the loss) takes over a failed one,
the lowest first: the plan has one failure fewer, and the rank restores that
position's state (restore_lineage: the lost rank's shard where a copy survives, else
a DP peer's of the same stage).

The profile is a job profile (`PipelineJob.from_profile`) plus "microbatches": the
micro-batches per replica per iteration.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..planner.job import PipelineJob, PlannerError, Worker
from ..planner.plan import NoSurvivor
from ..snapshots.restore_plan import Lineage
from .topology import Topology


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


Positions = dict[int, Worker]  # rank -> (replica, stage) on the plan's grid


def grid_positions(topology: Topology) -> Positions:
    """rank -> its own (replica, stage) in `topology`'s grid (spares hold none)."""
    return {c.rank: (c.dp, c.pp) for c in topology.coords if c.dp is not None}


def carried_positions(before: Mapping[int, Worker], current: Topology) -> Positions:
    """rank of `current` -> the position its previous rank held in `before` (a
    replacement node's rank: the position of the lost rank it replaces)."""
    where: Positions = {}
    for coord in current.coords:
        old = (current.previous_rank or {}).get(coord.rank)
        if old is None:
            old = (current.replaces or {}).get(coord.rank)
        if old is not None and old in before:
            where[coord.rank] = before[old]
    return where


def recycle_plan(
    current: Topology,
    profile: Mapping[str, Any],
    previous: Topology | None = None,
    previous_plan: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The plan file's content for generation `current`, or None when no plan can absorb
    what was lost (a stage with no survivor: the shrunk grid is all there is).

    Positions are kept on the grid of the first generation that had a plan: the
    previous generation's plan carries them (so a second failure is planned on the
    grid the first one was), else the previous generation's own grid; generation 0
    gets the fault-free plan of its own grid.
    """
    from ..planner.report import action_list
    from ..planner.scheduler import plan
    from ..planner.sim import simulate

    if previous_plan is not None:
        dp, pp = int(previous_plan["dp"]), int(previous_plan["pp"])
        before = {int(r): (int(w[0]), int(w[1])) for r, w in previous_plan["positions"].items()}
        where = carried_positions(before, current)
    elif previous is not None:
        dp, pp = previous.dp_size, previous.layout.pp
        where = carried_positions(grid_positions(previous), current)
    else:
        dp, pp = current.dp_size, current.layout.pp
        where = grid_positions(current)
    grid = {(r, s) for r in range(dp) for s in range(pp)}
    if current.layout.tp == 1:  # a position is one rank: a newcomer can take a lost one
        unplaced = [c.rank for c in current.coords if c.rank not in where]
        for rank, position in zip(unplaced, sorted(grid - set(where.values())), strict=False):
            where[rank] = position
    failed = grid - set(where.values())
    job = PipelineJob.from_profile(_durations(profile), dp, pp, int(profile["microbatches"]))
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


def failure_plan(job: PipelineJob, failed: list[Worker], schedule: str = "recycle") -> dict:
    """A plan file's content for `job` with these workers lost, the survivors numbered
    0, 1, ... in (replica, stage) order: what the agent would hand the workers of a
    job that lost them, for a benchmark or a test that runs the plan without an agent.
    `schedule` is the planner's ("recycle", "drop", "1f1b"); NoSurvivor where it
    cannot absorb the loss."""
    from ..planner.report import action_list
    from ..planner.scheduler import plan
    from ..planner.sim import simulate

    chosen = plan(job, failed, schedule)
    lost = set(chosen.failed)
    if schedule == "drop":  # a dropped replica's workers run nothing
        lost |= {(r, s) for r, _ in chosen.failed for s in range(job.pp)}
    alive = [(r, s) for r in range(job.dp) for s in range(job.pp) if (r, s) not in lost]
    return {
        "generation": 0,
        "positions": {str(rank): list(pos) for rank, pos in enumerate(alive)},
        **action_list(chosen, simulate(chosen)),
    }


def restore_lineage(
    previous_plan: Mapping[str, Any] | None, current_plan: Mapping[str, Any] | None
) -> dict[int, Lineage]:
    """rank -> whose state it continues, by plan position: the previous-generation rank
    that held its position, and those that held a position of the same stage. Empty
    without both plans (the grid's lineage applies); ranks with no position keep it."""
    if previous_plan is None or current_plan is None:
        return {}
    if (previous_plan["dp"], previous_plan["pp"]) != (current_plan["dp"], current_plan["pp"]):
        return {}  # another grid: positions do not carry over
    held = {(int(p[0]), int(p[1])): int(r) for r, p in previous_plan["positions"].items()}
    by_stage: dict[int, list[int]] = {}
    for (_, stage), rank in sorted(held.items()):
        by_stage.setdefault(stage, []).append(rank)
    lineage: dict[int, Lineage] = {}
    for rank, pos in current_plan["positions"].items():
        position = (int(pos[0]), int(pos[1]))
        own = held.get(position)
        peers = tuple(r for r in by_stage.get(position[1], []) if r != own)
        lineage[int(rank)] = Lineage(own, peers)
    return lineage


class PositionsError(ValueError):
    """Plan positions read back from the store that rtrain did not write."""


def encode_positions(plan: Mapping[str, Any]) -> str:
    """What a generation's plan carries to the next one: its grid and who holds what."""
    return json.dumps({"dp": plan["dp"], "pp": plan["pp"], "positions": plan["positions"]})


def decode_positions(payload: bytes | str) -> dict[str, Any]:
    """encode_positions' text, checked: a PositionsError says what is wrong with it."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PositionsError("ReCycle positions: not JSON") from None
    if not isinstance(data, dict):
        raise PositionsError("ReCycle positions: expected a JSON object")
    dp, pp, where = data.get("dp"), data.get("pp"), data.get("positions")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (dp, pp)):
        raise PositionsError("ReCycle positions: dp and pp must be positive integers")
    if not isinstance(where, dict):
        raise PositionsError("ReCycle positions: 'positions' must be an object")
    for rank, pos in where.items():
        if not (
            isinstance(rank, str)
            and rank.isdigit()
            and isinstance(pos, list)
            and len(pos) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in pos)
            and 0 <= pos[0] < dp
            and 0 <= pos[1] < pp
        ):
            raise PositionsError(f"ReCycle positions: rank {rank!r} -> {pos!r} is not on the grid")
    return {"dp": dp, "pp": pp, "positions": where}
