"""RepairCoordinator: repair in place, carried out. It reads what core/repair/decisions.py
decides on (each worker's exit, its state file, its process), calls those decisions,
and does what they return: asks workers to park, forks replacements, stops the workers
not kept, counts a failed repair for the job, and writes the `repair` event.

When a generation ends (a worker of this node failed, or the job moved on) and the
workers opted in (rtrain.repairable said "running" in this generation), the agent asks
each running worker to park instead of stopping them all: the worker releases its
process group, leaves the training function and says "parked". Those that say so within
ACK_S are kept, alive; the rest (no answer, an abort that hangs, a held process, a
worker that never opted in) are stopped the old way, alone. In the next generation a
kept worker is handed the new environment (agent/repair/handover.py) instead of a fork
from the pool. After FALLBACK_AFTER failed repairs the whole job stops repairing
(fallback.py). A GPU fault never parks (its workers must not stay on that GPU).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from ...core.clock import Clock, wait_until
from ...core.config.launch_spec import LaunchSpec
from ...core.errors import RendezvousError
from ...core.repair.decisions import (
    Ask,
    Outcome,
    Replaced,
    Skip,
    WorkerView,
    answers_in,
    repair_outcome,
    resumes,
    start_repair,
)
from ..generation import Generation
from ..observe.events import emit
from ..rendezvous.job import JobRendezvous
from ..runtime_dir import make_folder
from ..waiting import SYSTEM_CLOCK
from ..workers.group import SpareSpawner, Worker, WorkerGroup
from ..workers.hang_watch import process_state
from ..workers.pool import WorkerPool
from .control import WorkerControl
from .fallback import Fallback, JobFallback
from .handover import Handover, Parked, worker_view
from .through_watch import ThroughWatch
from .warm_spares import WarmSpares

logger = logging.getLogger(__name__)

ACK_S = 5.0  # a survivor asked to park must say so within this
POLL_S = 0.01  # how often the answers are read while the group is polled for exits


class RepairCoordinator:
    def __init__(
        self,
        runtime_dir: str,
        resume_wait_s: float,
        ack_s: float = ACK_S,
        clock: Clock = SYSTEM_CLOCK,
        wall: Callable[[], float] = time.time,
        process: Callable[[int], str | None] = process_state,
        lift_ceiling: Callable[[], None] = lambda: None,
        spares: tuple[int, str] = (0, ""),
    ) -> None:
        """clock: the answers' wait and the repair's duration; wall: the event's
        timestamps (compared with other processes'); process: a pid's state (psutil's
        name, None when gone); lift_ceiling: called when every worker of this node is a
        new one joining kept ranks elsewhere (the shard server's step ceiling is lifted
        until one of them commits: core/snapshots/admission.py); spares: warm spares
        per node and the run's log folder (agent/repair/warm_spares.py)."""
        self._lift_ceiling = lift_ceiling
        self._root = os.path.join(runtime_dir, "repair")
        count, log_root = spares
        self._spares = WarmSpares(count, self._root, log_root, process, wall) if count else None
        self._resume_wait_s = resume_wait_s
        self._ack_s = ack_s
        self._clock = clock
        self._wall = wall
        self._process = process
        self._fallback: Fallback | None = None  # the job stopped repairing
        self._parked: Parked | None = None
        make_folder(self._root, "the workers' repair folders")

    @classmethod
    def for_launch(
        cls,
        spec: LaunchSpec,
        runtime_dir: str,
        run_log_dir: str,
        clock: Clock,
        lift_ceiling: Callable[[], None],
    ) -> RepairCoordinator:
        """The agent's: its resume wait is the rendezvous' join timeout."""
        return cls(
            runtime_dir,
            spec.rdzv.join_timeout,
            clock=clock,
            wall=clock.wall,
            lift_ceiling=lift_ceiling,
            spares=(spec.faults.spares_per_node, run_log_dir),
        )

    def stand_by(self, pool: WorkerPool, nproc: int, spawner: Callable[[], SpareSpawner]) -> None:
        """This node waits as a standby: its pool warms up (and forks a blank process per
        worker); with --spares-per-node its workers start now, as spares warm at the
        repairable function's entry, which the takeover hands the lost node's ranks."""
        pool.standby([str(i) for i in range(nproc)])
        if self._spares is not None:
            self._spares.fill(spawner(), self._resume_wait_s, count=nproc)

    @property
    def enabled(self) -> bool:
        return self._fallback is None

    def control(self, local_rank: int) -> WorkerControl:
        return WorkerControl(self._root, local_rank)

    def view(self, worker: Worker) -> WorkerView:
        """The worker as the decisions see it: its exit, its state file, its process."""
        process = None if worker.exitcode is not None else self._process(worker.pid)
        return worker_view(worker, self.control(worker.local_rank), process)

    def park(
        self,
        gen: Generation,
        rdzv: JobRendezvous,
        gpu_fault: bool = False,
        restarts_left: bool = True,
    ) -> bool:
        """Ask this generation's running workers to park; True when some were kept (the
        rest are stopped), False when none was (the caller stops the group as today).
        A node of opted-in workers writes its `repair` event even when it keeps none
        (its workers all failed, or none parked): the job's record of the repair names
        every rank it restarted."""
        self._parked = None
        group = gen.group
        job = JobFallback(rdzv.store, rdzv.keys)
        views = [self.view(w) for w in group.workers]
        decision = start_repair(views, gen.number, gpu_fault, self.enabled, restarts_left)
        if isinstance(decision, Ask) and not self._still_on(job, gen.number):
            decision = Skip.JOB_FALLBACK
        if isinstance(decision, Skip):
            if decision is not Skip.NOT_OPTED_IN:
                logger.info("not repairing in place: %s", decision.value)
            return False
        started, fault_seen = self._clock.now(), self._wall()
        # The failed workers' replacements fork now, while the survivors park and the
        # next round closes, not after (the next start hands them their requests).
        group.prefork(list(decision.replace))
        spawn_started = self._wall() if decision.replace else None
        for local_rank in decision.ask:
            self.control(local_rank).request(gen.number)
        outcome = self._answers(group, decision)
        parked = self._wall()
        if outcome.replaced:
            self._replace(group, outcome)
            spawn_started = spawn_started or self._wall()
        job_fallback = self._count_failure(job, gen) if outcome.failed else False
        restarted = outcome.ranks(views)
        emit(
            "repair",
            from_generation=gen.number,
            kept=sorted(outcome.kept_ranks.values()),
            restarted=restarted,
            fallback=sorted(w.rank for w in group.workers if w.left_out),
            stuck=sorted(
                w.rank
                for w in group.workers
                if outcome.replaced.get(w.local_rank) is Replaced.STUCK
            ),
            job_fallback=job_fallback,
            seconds=round(self._clock.now() - started, 6),
            # wall clock: the replacements' fork began before the survivors were parked
            fault_seen=round(fault_seen, 6),
            spawn_started=None if spawn_started is None else round(spawn_started, 6),
            parked=round(parked, 6),
        )
        logger.info(
            "repairing in place: kept ranks %s alive, restarting ranks %s",
            sorted(outcome.kept_ranks.values()),
            restarted,
        )
        if outcome.kept:
            self._parked = Parked(gen.number, dict(outcome.kept), dict(outcome.kept_ranks))
        return bool(outcome.kept)

    def _answers(self, group: WorkerGroup, decision: Ask) -> Outcome:
        """Poll the group (its exits are the wait) until the decisions say the answers
        are in; the outcome of what was seen last."""
        started = self._clock.now()

        def answered() -> bool:
            views = [self.view(w) for w in group.workers if w.local_rank in decision.ask]
            return answers_in(views, self._clock.now() - started, self._ack_s)

        wait_until(answered, None, POLL_S, self._clock.now, group.poll)
        return repair_outcome([self.view(w) for w in group.workers], decision.ask)

    def _replace(self, group: WorkerGroup, outcome: Outcome) -> None:
        """Stop the asked workers not kept, each alone, and fork their replacements."""
        reasons: dict[Replaced, list[int]] = {}
        for worker in group.workers:
            why = outcome.replaced.get(worker.local_rank)
            if why is not None:
                reasons.setdefault(why, []).append(worker.rank)
        said = [f"ranks {sorted(r)} {why.value}" for why, r in reasons.items()]
        logger.warning("repair in place: replacing %s", "; ".join(said))
        local_ranks = sorted(outcome.replaced)
        group.leave_out(local_ranks)
        group.prefork(local_ranks)

    def _still_on(self, job: JobFallback, generation: int) -> bool:
        """Whether the job still repairs in place (one store read per generation's end;
        an unreadable store: not this time, the workers restart as today)."""
        if self._fallback is None:
            try:
                found = job.read()
            except RendezvousError as exc:
                logger.warning("repair in place skipped: the store did not answer (%s)", exc)
                return False
            if found is not None:
                self._turn_off(found, generation)
        return self._fallback is None

    def _turn_off(self, found: Fallback, generation: int) -> None:
        self._fallback = found
        logger.warning(
            "repair in place is off for the job: repairs of generations %s failed; "
            "restarting workers from now on",
            ", ".join(str(g) for g in found.failed) or "?",
        )
        emit(
            "repair_fallback",
            at_generation=generation,
            from_generation=found.generation,
            by_node=found.node_rank,
            failed_generations=list(found.failed),
        )

    def _count_failure(self, job: JobFallback, gen: Generation) -> bool:
        """Count this generation's repair as failed for the job; True when this node's
        count turned repair off for the job."""
        try:
            written = job.failed(gen.number, gen.node_rank)
        except RendezvousError as exc:
            logger.warning("repair in place: could not count a failed repair (%s)", exc)
            return False
        if written is not None:
            self._turn_off(written, gen.number)
        return written is not None

    def hand_over(
        self, gen: Generation, rdzv: JobRendezvous, watch: Callable[[], object] | None = None
    ) -> None:
        """Give the new generation's group this node's parked workers and the variables:
        among them every member's kept ranks (exchanged through the store in each
        generation after the first, kept ones or not: a node that kept none must still
        say so). GenerationEnded if the generation is over meanwhile."""
        kept: tuple[int, ...] = ()
        if gen.number > 0:
            mine = [] if self._parked is None else self._resuming(gen)
            timeout, nodes = self._resume_wait_s, len(gen.membership.members)
            kept = rdzv.kept.exchange(gen.number, gen.node_rank, nodes, mine, timeout, watch)
        world = sum(member.local_world_size for member in gen.membership.members)
        if kept and not set(self._ranks_here(gen)) & set(kept):
            self._lift_ceiling()
        through = ThroughWatch(self.control, gen.number, kept, world, self._wall)
        gen.group.handover = Handover(
            self.control,
            self._parked,
            gen.number,
            gen.hangs.timeout,
            self._resume_wait_s,
            lambda: self.enabled,
            self._process,
            kept,
            through,
            self._spares,
        )
        self._parked = None

    @staticmethod
    def _ranks_here(gen: Generation) -> list[int]:
        assignment = gen.group.assignment
        return [assignment.global_rank(local) for local in range(assignment.local_world_size)]

    def _resuming(self, gen: Generation) -> list[int]:
        """The new generation's ranks of this node's parked workers that can resume."""
        assert self._parked is not None
        assignment = gen.group.assignment
        return [
            assignment.global_rank(local_rank)
            for local_rank, pid in self._parked.kept.items()
            if local_rank < assignment.local_world_size and resumes(pid, self._process(pid))
        ]
