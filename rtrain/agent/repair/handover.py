"""Handover: a repair in place as the next generation's worker group meets it (the
group's one seam with repair, agent/workers/group.py's RepairSeam): the variables every
worker gets, a kept worker handed this generation's environment instead of a spawn, a
kept worker that cannot resume named so that the group ends it before its replacement
starts, and a silent worker spared for the repair instead of killed as hung."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...core.contract.environment import KEPT_RANKS, encode_ranks
from ...core.contract.repair_files import REPAIR_DIR, REPAIR_WAIT, RESUME_WAIT
from ...core.observe.through import ThroughNote
from ...core.repair.decisions import WorkerView, resumes, spares_victim
from ..observe.events import emit
from ..workers.group import SpareSpawner, Worker
from ..workers.hang_watch import HangFinding
from .control import WorkerControl
from .through_watch import ThroughWatch
from .warm_spares import WarmSpares

logger = logging.getLogger(__name__)

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


def worker_view(worker: Worker, control: WorkerControl, process: str | None) -> WorkerView:
    """The worker as the repair decisions see it: its exit, its state file (what it
    said, for which generation, as which pid) and its process's state."""
    state = control.state()
    return WorkerView(
        local_rank=worker.local_rank,
        rank=worker.rank,
        pid=worker.pid,
        exited=worker.exitcode is not None,
        said=None if state is None else state.state,
        said_generation=None if state is None else state.generation,
        said_pid=None if state is None else state.pid,
        process=process,
    )


class Handover:
    def __init__(
        self,
        control: Callable[[int], WorkerControl],
        parked: Parked | None,
        generation: int,
        hang_s: float,
        resume_wait_s: float,
        job_repairs: Callable[[], bool],
        process: Callable[[int], str | None],
        kept_ranks: tuple[int, ...] = (),
        through: ThroughWatch | None = None,
        spares: WarmSpares | None = None,
    ) -> None:
        """kept_ranks: every member's ranks of this generation kept alive by the repair
        (agent/rendezvous/kept_ranks.py), for every worker's RTRAIN_KEPT_RANKS; through:
        the watch of the kept ranks training through (events, status); spares: the
        node's warm spares (--spares-per-node)."""
        self._spares = spares
        self._control = control
        self._kept_ranks = kept_ranks
        self._through = through
        self._parked = parked
        self._generation = generation
        self._hang_s = hang_s
        self._resume_wait_s = resume_wait_s
        self._job_repairs = job_repairs
        self._process = process
        self._spared: set[int] = set()
        self._stale: dict[int, int] = {}  # local rank -> a kept pid that did not resume

    def env(self, local_rank: int) -> Mapping[str, str]:
        return {
            REPAIR_DIR: self._control(local_rank).folder,
            REPAIR_WAIT: str(WORKER_WAIT_S),
            RESUME_WAIT: str(self._resume_wait_s),
            KEPT_RANKS: encode_ranks(list(self._kept_ranks)),
        }

    def resume(self, local_rank: int, env: Mapping[str, str]) -> int | None:
        """The kept worker's pid, handed `env` (addressed to that pid alone); None: a
        fresh worker starts, its folder cleared (and a kept one that cannot resume is
        left for stale())."""
        control = self._control(local_rank)
        pid = None if self._parked is None else self._parked.kept.get(local_rank)
        state = None if pid is None else self._process(pid)
        if pid is not None and resumes(pid, state):
            control.resume(self._generation, pid, dict(env))
            return pid
        control.clear()
        if pid is not None and self._parked is not None:
            self._lost(local_rank, pid, state)
        return None

    def take_spare(self, local_rank: int, env: Mapping[str, str]) -> int | None:
        """A warm spare's pid, handed `env` (a new worker of this local rank); None: none
        is warm, a process starts. Only in a generation that a repair in place made (a
        full restart starts every worker anew, as torchrun does)."""
        if self._spares is None or (self._parked is None and not self._kept_ranks):
            return None
        return self._spares.take(self._generation, int(env.get("RANK", "-1")), env)

    def fill_spares(self, spawn: SpareSpawner) -> None:
        if self._spares is not None:  # made only for --spares-per-node above 0
            self._spares.fill(spawn, self._resume_wait_s)

    def _lost(self, local_rank: int, pid: int, state: str | None) -> None:
        """A kept worker that cannot resume: ended before its replacement, and said."""
        assert self._parked is not None
        why = "gone" if state is None else f"{state} while parked"
        if state is not None:
            self._stale[local_rank] = pid
        rank = self._parked.ranks.get(local_rank, -1)
        logger.warning("rank %d (pid %d) %s: replaced", rank, pid, why)
        emit(
            "repair_lost",
            from_generation=self._parked.generation,
            rank=rank,
            pid=pid,
            why=why,
        )

    def stale(self, local_rank: int) -> int | None:
        """A kept process of this local rank that did not resume: the group ends it
        (SIGKILL, reaped) before its replacement starts, so it can never come back."""
        return self._stale.pop(local_rank, None)

    def observe(self, workers: Sequence[Worker]) -> ThroughNote | None:
        """The generation's train-through as this node's workers say it (None: none)."""
        return None if self._through is None else self._through.see(workers)

    def spares(self, worker: Worker, finding: HangFinding, silent_s: float) -> bool:
        """Whether to leave a silent worker alive for the repair: an opted-in one whose
        process is not held (likely waiting on a hung peer), for a bounded time."""
        view = worker_view(worker, self._control(worker.local_rank), process="running")
        spare = spares_victim(
            self._job_repairs(),
            view.opted_in(self._generation),
            finding.held,
            silent_s,
            self._hang_s,
            SPARE_VICTIMS_FOR,
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
