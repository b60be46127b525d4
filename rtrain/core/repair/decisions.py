"""Repair in place, decided: which workers a node asks to park, when it stops waiting
for their answers, whom it keeps, whom it replaces, whether the repair failed, and
whether a silent worker is spared for the repair. Pure functions of what the agent saw
(WorkerView: a worker's exit, its state file, its process) and of the seconds it gives
them, in the style of core/rendezvous/decisions.py; agent/repair/coordinator.py reads
the world, calls these, and carries out what they return
(tests/unit/core/test_repair_decisions.py drives every branch without a process).

The order of a repair, one generation's end on one node:
  start_repair  -> Skip (stop the group as without repair) or Ask (these workers)
  answers_in    -> False while an asked worker may still answer, True when none can
  repair_outcome-> kept, replaced (with the reason of each), failed
  resumes       -> whether a kept worker can enter the next generation, or is replaced
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..contract.repair_files import PARKED, RUNNING, STUCK

# A process in one of these states (psutil's names) cannot answer or resume: stopped by
# a signal or a debugger, a zombie, or gone (None).
HELD = frozenset({"stopped", "tracing-stop", "zombie"})


@dataclass(frozen=True)
class WorkerView:
    """One worker as the agent saw it at one moment."""

    local_rank: int
    rank: int
    pid: int
    exited: bool
    # its state file: what it said (running, parked, stuck), for which generation, and
    # the pid that wrote it; None where it has none or it cannot be read
    said: str | None = None
    said_generation: int | None = None
    said_pid: int | None = None
    process: str | None = "running"  # psutil's state name; None: gone

    def opted_in(self, generation: int) -> bool:
        """It said "running" in this generation, as itself: rtrain.repairable runs."""
        return (
            self.said == RUNNING
            and self.said_pid == self.pid
            and self.said_generation == generation
        )

    @property
    def answer(self) -> str | None:
        """What this process said (a file left by another pid says nothing of it)."""
        return self.said if self.said_pid == self.pid else None

    @property
    def held(self) -> bool:
        return self.process is None or self.process in HELD


class Skip(enum.Enum):
    """Why a node stops its workers as without repair in place."""

    NOT_OPTED_IN = "no worker runs rtrain.repairable"
    GPU_FAULT = "a GPU fault: its workers must not stay on that GPU"
    JOB_FALLBACK = "repair in place is off for the job"
    JOB_ENDING = "no restart is left: the job ends"


@dataclass(frozen=True)
class Ask:
    """Ask these running, opted-in workers to park; fork the exited ones' replacements."""

    ask: tuple[int, ...]  # local ranks
    replace: tuple[int, ...]  # local ranks whose workers exited


def start_repair(
    workers: Sequence[WorkerView],
    generation: int,
    gpu_fault: bool,
    job_repairs: bool,
    restarts_left: bool = True,
) -> Skip | Ask:
    """Whether a node's generation ends in a repair in place. Workers opted in if a
    running one says so or, with none running (all failed), any of them said so."""
    running = [w for w in workers if not w.exited]
    if not any(w.opted_in(generation) for w in running or workers):
        return Skip.NOT_OPTED_IN
    if gpu_fault:
        return Skip.GPU_FAULT
    if not restarts_left:
        return Skip.JOB_ENDING
    if not job_repairs:
        return Skip.JOB_FALLBACK
    return Ask(
        ask=tuple(w.local_rank for w in running if w.opted_in(generation)),
        replace=tuple(w.local_rank for w in workers if w.exited),
    )


def _settled(worker: WorkerView) -> bool:
    """Nothing more will come from it: exited, answered for good, or held."""
    return worker.exited or worker.answer in (PARKED, STUCK) or worker.held


def answers_in(asked: Sequence[WorkerView], waited_s: float, ack_s: float) -> bool:
    """Whether the node stops waiting for the asked workers' answers: every one has
    settled (a held process cannot answer: it is replaced now, not after ack_s), or
    ack_s has passed."""
    return waited_s >= ack_s or all(_settled(w) for w in asked)


class Replaced(enum.Enum):
    """Why an asked worker that had not exited is stopped and replaced."""

    STUCK = "stuck after its release"
    HELD = "stopped while parked"
    SILENT = "gave no answer"
    NOT_ASKED = "not running rtrain.repairable"


@dataclass(frozen=True)
class Outcome:
    """A node's repair of one generation, once the answers are in."""

    kept: dict[int, int]  # local rank -> pid, alive and parked
    kept_ranks: dict[int, int]  # local rank -> global rank in the ended generation
    replaced: dict[int, Replaced]  # local rank -> why, for workers still running
    failed: bool  # the job's count of failed repairs takes this generation

    def ranks(self, workers: Sequence[WorkerView]) -> list[int]:
        """The global ranks this node restarts (every worker not kept)."""
        return sorted(w.rank for w in workers if w.local_rank not in self.kept)


def repair_outcome(workers: Sequence[WorkerView], asked: Sequence[int]) -> Outcome:
    """Who is kept: an asked worker that said "parked" and is not held. Who is
    replaced: every other worker still running (the executor stops it). The
    repair failed when something asked was not kept, or nothing was (a node that asked
    none, its workers all failed, counts nothing)."""
    kept: dict[int, int] = {}
    ranks: dict[int, int] = {}
    replaced: dict[int, Replaced] = {}
    for worker in workers:
        if worker.exited:
            continue
        if worker.local_rank in asked and worker.answer == PARKED and not worker.held:
            kept[worker.local_rank], ranks[worker.local_rank] = worker.pid, worker.rank
        else:
            replaced[worker.local_rank] = _why_replaced(worker, asked)
    failed = bool(asked) and (bool(replaced) or not kept)
    return Outcome(kept, ranks, replaced, failed)


def _why_replaced(worker: WorkerView, asked: Sequence[int]) -> Replaced:
    if worker.local_rank not in asked:
        return Replaced.NOT_ASKED
    if worker.answer == STUCK:
        return Replaced.STUCK
    return Replaced.HELD if worker.held else Replaced.SILENT


def resumes(parked_pid: int | None, process: str | None) -> bool:
    """Whether a worker kept by the last repair enters the next generation: it was
    kept, and its process is neither held nor gone (else it is replaced)."""
    return parked_pid is not None and process is not None and process not in HELD


def spares_victim(
    job_repairs: bool, opted_in: bool, held: bool, silent_s: float, hang_s: float, spare_for: float
) -> bool:
    """Whether a silent worker is left alive for the repair rather than killed as hung:
    an opted-in worker whose process is not held is taken for a victim of a hung peer
    (a DDP survivor waits in backward(), whose stack shows no torch.distributed frame),
    for `spare_for` hang timeouts of silence at most."""
    return job_repairs and opted_in and not held and silent_s < spare_for * hang_s
