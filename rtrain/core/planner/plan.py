"""The work of an iteration, where each piece runs, and Failure Normalization (the
dependency graph itself is index.py's).

Every micro-batch m of replica r passes every stage s: F(r, m, s), then B(r, m, s) on
the way back, then W(r, m, s); each worker ends an iteration with its optimizer step,
OPT, once the weight gradients of its stage are all in (their all-reduce). Which
worker runs (r, m, s) is the assignment: normally (r, s); ReCycle re-routes the
micro-batches of a failed (r, s) evenly over the surviving stage-s workers of the
other replicas, which hold the same parameters; dropping replicas moves a failed
replica's micro-batches whole onto the surviving replicas. Either way every
micro-batch of every replica is processed exactly once per stage, so each stage's
gradients sum over the same micro-batches as without the failure.

Failure Normalization: workers of one stage are interchangeable, so a failure set is
characterised by how many workers each stage lost. The canonical set puts stage s's
c_s failures on the last c_s replicas; a plan is made once for it and mapped back to
the physical workers, stage by stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from ..repair.spread import spread
from .job import PipelineJob, PlannerError, Worker

Unit = tuple[int, int, int]  # (replica, microbatch, stage)


class Op(NamedTuple):
    """A named tuple, not a dataclass: plans hold 10^5 of them in dicts, and a tuple's
    hash and equality run in C."""

    kind: str  # "F", "B", "W", "OPT"; "SYNC" for a barrier
    iteration: int
    replica: int  # the micro-batch's replica (for OPT: the worker's replica)
    microbatch: int  # -1 for OPT
    stage: int

    def label(self) -> str:
        if self.kind == "OPT":
            return f"OPT it{self.iteration}"
        return f"{self.kind} r{self.replica}m{self.microbatch}"


@dataclass
class Plan:
    """For every surviving worker the ordered list of its operations."""

    job: PipelineJob
    failed: frozenset[Worker]  # physical
    schedule: str
    staggered: bool
    iterations: int
    assignment: dict[Unit, Worker]  # in logical workers
    orders: dict[Worker, list[Op]]  # logical worker -> its ops in order
    mapping: dict[Worker, Worker] = field(default_factory=dict)  # physical -> logical

    @property
    def workers(self) -> list[Worker]:
        return sorted(self.orders)

    @cached_property
    def _logical_to_physical(self) -> dict[Worker, Worker]:
        return {v: k for k, v in self.mapping.items()}

    def physical(self, logical: Worker) -> Worker:
        return self._logical_to_physical.get(logical, logical)


class NoSurvivor(PlannerError):
    """Some stage lost every worker: no re-routing can absorb that."""


def check_failures(job: PipelineJob, failed: Iterable[Worker]) -> frozenset[Worker]:
    found = set()
    for replica, stage in failed:
        if not (0 <= replica < job.dp and 0 <= stage < job.pp):
            raise PlannerError(
                f"failed worker {replica}:{stage} is outside DP={job.dp} x PP={job.pp} "
                "(REPLICA:STAGE, both from 0)"
            )
        found.add((replica, stage))
    return frozenset(found)


def survivors(job: PipelineJob, failed: frozenset[Worker]) -> list[Worker]:
    return [(r, s) for r in range(job.dp) for s in range(job.pp) if (r, s) not in failed]


def normalize(job: PipelineJob, failed: frozenset[Worker]) -> tuple[frozenset[Worker], dict]:
    """(canonical failure set, physical -> logical mapping of every worker)."""
    canonical: set[Worker] = set()
    mapping: dict[Worker, Worker] = {}
    for stage in range(job.pp):
        lost = sorted(r for r in range(job.dp) if (r, stage) in failed)
        kept = sorted(r for r in range(job.dp) if (r, stage) not in failed)
        logical_kept = list(range(job.dp - len(lost)))
        logical_lost = list(range(job.dp - len(lost), job.dp))
        for physical, logical in zip(kept + lost, logical_kept + logical_lost, strict=True):
            mapping[(physical, stage)] = (logical, stage)
        canonical.update((r, stage) for r in logical_lost)
    return frozenset(canonical), mapping


def reroute(job: PipelineJob, failed: frozenset[Worker]) -> dict[Unit, Worker]:
    """ReCycle's assignment: a failed worker's micro-batches, spread over its stage's
    survivors by the rule every rerouting in rtrain follows (core/repair/spread.py:
    each to the least loaded; a tie to the next replica round the ring)."""
    assignment: dict[Unit, Worker] = {}
    for stage in range(job.pp):
        alive = [r for r in range(job.dp) if (r, stage) not in failed]
        if not alive:
            raise NoSurvivor(
                f"stage {stage} lost all {job.dp} of its workers: no same-stage peer is left "
                "to take over its micro-batches; the fallback is to restart from a checkpoint"
            )
        units = [(r, m, stage) for r in range(job.dp) for m in range(job.microbatches)]
        missing = [(r, (r, m, s)) for r, m, s in units if r not in alive]
        placed = spread(missing, dict.fromkeys(alive, job.microbatches), job.dp)
        for r, m, s in units:
            assignment[(r, m, s)] = (placed.get((r, m, s), r), stage)
    return assignment


def drop_replicas(job: PipelineJob, failed: frozenset[Worker]) -> dict[Unit, Worker]:
    """The baseline: a replica that lost any worker is dropped, and its micro-batches
    move whole (every stage) onto the surviving replicas, spread evenly."""
    broken = {r for r, _ in failed}
    alive = [r for r in range(job.dp) if r not in broken]
    if not alive:
        raise NoSurvivor("every replica lost a worker: dropping them leaves nothing to run")
    load = {r: job.microbatches for r in alive}
    assignment: dict[Unit, Worker] = {}
    for replica in range(job.dp):
        for m in range(job.microbatches):
            if replica in load:
                target = replica
            else:
                target = min(alive, key=lambda r: (load[r], r))
                load[target] += 1
            for stage in range(job.pp):
                assignment[(replica, m, stage)] = (target, stage)
    return assignment
