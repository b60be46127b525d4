"""RepairCoordinator: repair in place, the agent's side.

When a generation ends (a worker of this node failed, or the job moved on) and the
workers opted in (rtrain.repairable said "running" in this generation), the agent asks
each running worker to park instead of stopping them all: the worker releases its
process group, leaves the training function and says "parked". Those that say so
within ACK_S are kept, alive; the rest (no answer, an abort that hangs, a worker that
never opted in) are stopped the old way, alone. In the next generation a kept worker
is handed the new environment (resume) instead of a fork from the pool; the others
start fresh from the pool, as every worker does today. After FALLBACK_AFTER failed
repairs (generations in which some node had to stop a worker it asked to park), the
whole job stops repairing (fallback.py: one record on the rendezvous store, read at
each generation's end). A GPU fault never parks (its workers must not stay on that GPU).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...core.clock import wait_until
from ...core.errors import RendezvousError
from ...core.worker.repair.wire import (
    PARKED,
    REPAIR_DIR,
    REPAIR_WAIT,
    RESUME_WAIT,
    RUNNING,
    STUCK,
)
from ..generation import Generation
from ..observe.events import emit
from ..rendezvous.job import JobRendezvous
from ..runtime_dir import make_folder
from ..workers.group import Worker
from ..workers.hang_watch import STOPPED_STATES, HangFinding, process_state
from .control import WorkerControl
from .fallback import Fallback, JobFallback

logger = logging.getLogger(__name__)

ACK_S = 5.0  # a survivor asked to park must say so within this
WORKER_WAIT_S = 30.0  # a worker whose collective broke waits this long to be asked
# A victim of a hung peer (silent, waiting in a collective, not held) is left to the
# repair for this many hang timeouts of silence: the culprit's node kills the culprit
# and moves the job on, and the repair frees the victim; past it, it is killed as today.
SPARE_VICTIMS_FOR = 2.0


@dataclass
class Parked:
    generation: int
    kept: dict[int, int] = field(default_factory=dict)  # local rank -> pid
    ranks: dict[int, int] = field(default_factory=dict)  # local rank -> global rank then


class RepairCoordinator:
    def __init__(self, runtime_dir: str, resume_wait_s: float, ack_s: float = ACK_S) -> None:
        self._root = os.path.join(runtime_dir, "repair")
        self._resume_wait_s = resume_wait_s
        self._ack_s = ack_s
        self._fallback: Fallback | None = None  # the job stopped repairing
        self._parked: Parked | None = None
        make_folder(self._root, "the workers' repair folders")

    @property
    def enabled(self) -> bool:
        return self._fallback is None

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

    def control(self, local_rank: int) -> WorkerControl:
        return WorkerControl(self._root, local_rank)

    def _opted_in(self, gen: Generation, worker: Worker) -> bool:
        state = self.control(worker.local_rank).state()
        return (
            state is not None
            and state.pid == worker.pid
            and state.generation == gen.number
            and state.state == RUNNING
        )

    def park(self, gen: Generation, rdzv: JobRendezvous) -> bool:
        """Ask this generation's running workers to park; True when some were kept (the
        rest are stopped), False when none was (the caller stops the group as today).
        A node of opted-in workers writes its `repair` event even when it keeps none
        (its workers all failed, or none parked): the job's record of the repair names
        every rank it restarted."""
        self._parked = None
        group = gen.group
        running = group.running
        # None running: its workers all failed; they opted in if they said "running"
        if not any(self._opted_in(gen, w) for w in running or group.workers):
            return False
        job = JobFallback(rdzv.store, rdzv.keys)
        if not self._still_on(job, gen.number):
            return False
        started, fault_seen = time.monotonic(), time.time()
        # The failed workers' replacements fork now, while the survivors park and the
        # next round closes, not after (the next start hands them their requests).
        exited = [w.local_rank for w in group.workers if w.exitcode is not None]
        group.prefork(exited)
        spawn_started = time.time() if exited else None
        asked = [w for w in running if self._opted_in(gen, w)]
        for worker in asked:
            self.control(worker.local_rank).request(gen.number)

        def answer(worker: Worker) -> str | None:
            """What the worker said (its own state file, its pid), or None."""
            state = self.control(worker.local_rank).state()
            return state.state if state is not None and state.pid == worker.pid else None

        def all_answered() -> bool:
            # "stuck": released and still blocked, idle (core/worker/repair/repairable.py);
            # restarted now, not after ACK_S
            return all(w.exitcode is not None or answer(w) in (PARKED, STUCK) for w in asked)

        wait_until(all_answered, self._ack_s, 0.01, time.monotonic, group.poll)
        parked = time.time()
        answers = {w.local_rank: answer(w) for w in asked if w.exitcode is None}
        stuck = [w.rank for w in asked if answers.get(w.local_rank) == STUCK]
        kept = [w for w in asked if answers.get(w.local_rank) == PARKED]
        kept = [w for w in kept if process_state(w.pid) not in (*STOPPED_STATES, None, "zombie")]
        left = [w.local_rank for w in group.running if w not in kept]
        if left:
            logger.warning(
                "repair in place: %d workers did not park (stuck after their release: "
                "ranks %s; the others gave no answer within %gs); stopping them",
                len(left),
                sorted(stuck),
                self._ack_s,
            )
            group.leave_out(left)
            group.prefork(left)
            spawn_started = spawn_started or time.time()
        # Failed: a worker asked to park was stopped, or none of those asked was kept.
        # A node that asked none (its workers all failed) counts nothing.
        failed = bool(asked) and (bool(left) or not kept)
        job_fallback = self._count_failure(job, gen) if failed else False
        self._parked = Parked(
            gen.number,
            {w.local_rank: w.pid for w in kept},
            {w.local_rank: w.rank for w in kept},
        )
        restarted = [w.rank for w in group.workers if w not in kept]
        emit(
            "repair",
            from_generation=gen.number,
            kept=sorted(self._parked.ranks.values()),
            restarted=sorted(restarted),
            fallback=sorted(w.rank for w in group.workers if w.left_out),
            stuck=sorted(stuck),
            job_fallback=job_fallback,
            seconds=round(time.monotonic() - started, 6),
            # wall clock: the replacements' fork began before the survivors were parked
            fault_seen=round(fault_seen, 6),
            spawn_started=None if spawn_started is None else round(spawn_started, 6),
            parked=round(parked, 6),
        )
        logger.info(
            "repair in place: kept ranks %s alive, restarting ranks %s",
            sorted(self._parked.ranks.values()),
            sorted(restarted),
        )
        if not kept:  # the event said so; nothing to hand over
            self._parked = None
        return bool(kept)

    def hand_over(self, gen: Generation) -> None:
        """Give the new generation's group this node's parked workers and the variables."""
        gen.group.handover = _Handover(self, self._parked, gen.number, gen.hangs.timeout)
        self._parked = None


class _Handover:
    def __init__(
        self, owner: RepairCoordinator, parked: Parked | None, generation: int, hang_s: float
    ) -> None:
        self._owner = owner
        self._parked = parked
        self._generation = generation
        self._hang_s = hang_s
        self._spared: set[int] = set()

    def env(self, local_rank: int) -> Mapping[str, str]:
        owner = self._owner
        return {
            REPAIR_DIR: owner.control(local_rank).folder,
            REPAIR_WAIT: str(WORKER_WAIT_S),
            RESUME_WAIT: str(owner._resume_wait_s),
        }

    def resume(self, local_rank: int, env: Mapping[str, str]) -> int | None:
        control = self._owner.control(local_rank)
        pid = None if self._parked is None else self._parked.kept.get(local_rank)
        if pid is not None and process_state(pid) not in (*STOPPED_STATES, None, "zombie"):
            control.resume(self._generation, dict(env))
            return pid
        control.clear()
        return None

    def spares(self, worker: Worker, finding: HangFinding, silent_s: float) -> bool:
        """Whether to leave a silent worker alive for the repair: an opted-in one whose
        process is not held (likely waiting on a hung peer), for a bounded time."""
        owner = self._owner
        state = owner.control(worker.local_rank).state()
        opted_in = (
            state is not None
            and state.state == RUNNING
            and state.pid == worker.pid
            and state.generation == self._generation
        )
        # Not finding.victim: a DDP survivor waits in backward(), whose stack shows no
        # torch.distributed frame; any opted-in worker not held is taken for a victim.
        spare = (
            owner.enabled
            and opted_in
            and not finding.held
            and silent_s < SPARE_VICTIMS_FOR * self._hang_s
        )
        if spare and worker.local_rank not in self._spared:
            self._spared.add(worker.local_rank)
            logger.warning(
                "worker rank %d is silent in a collective (a victim of a hung peer): left "
                "for the repair in place, killed if still silent after %gs",
                worker.rank,
                SPARE_VICTIMS_FOR * self._hang_s,
            )
        return spare
