"""WarmSpares: a node's warm spare workers (rtrain launch --spares-per-node N).

After each generation's workers start, the node tops its spares up to N: each is a
worker process of the script, started from the pool like the others but as spare
`slot` (RTRAIN_SPARE, RANK -1, no MASTER_ADDR; its logs under <run log dir>/spares/).
It runs the script's start-up and waits, parked, at the entry of rtrain.repairable
(core/worker/repair/warm_spare.py). When a repair in place replaces a rank of this
node, the next generation's start hands the rank's environment to a parked spare (its
resume file, addressed to its pid) instead of starting a process, so the join costs
the state copy and the regroup, not the script's start-up.

Spares live across generations; a full restart stops them with the workers (the pool
signals all), and the next start begins new ones. One that ends on its own before it
reached the function (its error file written: a plain script, which cannot use one, or
a start-up that fails) turns spares off for the node, said once (`spares_off`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...core.contract.environment import SPARE
from ...core.contract.repair_files import PARKED, REPAIR_DIR, RESUME_WAIT
from ...core.rendezvous.failures import RecordError, parse_error_file
from ...core.repair.decisions import resumes
from ..observe.events import emit
from ..workers.group import SpareSpawner
from .control import WorkerControl

logger = logging.getLogger(__name__)

ERROR_FILE_LIMIT = 1 << 22


@dataclass
class _Spare:
    slot: int
    pid: int
    control: WorkerControl
    error_file: str
    started: float  # wall clock


class WarmSpares:
    def __init__(
        self,
        count: int,
        repair_root: str,
        log_root: str,
        process: Callable[[int], str | None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        """count: spares per node; repair_root: the control folders' parent; log_root:
        the run's log folder; process: a pid's state (psutil's name, None when gone)."""
        self.count = count
        self._root = repair_root
        self._logs = os.path.join(log_root, "spares")
        self._process = process
        self._wall = wall
        self._spares: dict[int, _Spare] = {}
        self._started = 0  # spares started by this node: each gets a log folder of its own
        self._off = False

    def take(self, generation: int, rank: int, env: Mapping[str, str]) -> int | None:
        """Hand `env` (rank's new worker's) to a spare, a parked one first, else one still
        in its start-up (it reads the hand-over once it reaches the function: further
        on than a new process); its pid (None: none is alive)."""
        alive = [(self._parked(s), s) for s in self._spares.values() if self._resumes(s)]
        if not alive:
            return None
        parked, spare = min(alive, key=lambda found: (not found[0], found[1].slot))
        spare.control.resume(generation, spare.pid, dict(env))
        del self._spares[spare.slot]
        warm_s = round(self._wall() - spare.started, 3)
        logger.info(
            "rank %d: spare %d (pid %d, %s) takes its place",
            rank,
            spare.slot,
            spare.pid,
            "warm" if parked else "still starting up",
        )
        emit(
            "spare_taken",
            slot=spare.slot,
            pid=spare.pid,
            rank=rank,
            warm_s=warm_s,
            parked=parked,
        )
        return spare.pid

    def _resumes(self, spare: _Spare) -> bool:
        return resumes(spare.pid, self._process(spare.pid))

    @staticmethod
    def _parked(spare: _Spare) -> bool:
        said = spare.control.state()
        return said is not None and said.state == PARKED and said.pid == spare.pid

    def fill(self, spawn: SpareSpawner, resume_wait_s: float, count: int | None = None) -> None:
        """Start a spare in each slot that has none alive: `count` slots (a standby
        node's: one per worker), else --spares-per-node (after a generation's workers)."""
        if self._off:
            return
        for slot in range(self.count if count is None else count):
            spare = self._spares.get(slot)
            if spare is not None and self._process(spare.pid) is not None:
                continue
            if spare is not None and self._failed_on_its_own(spare):
                return
            self._start(slot, spawn, resume_wait_s)

    def _start(self, slot: int, spawn: SpareSpawner, resume_wait_s: float) -> None:
        # A folder of its own, as its logs: the spare a take just handed a rank may not
        # have read its resume yet when the slot's next spare starts.
        name = f"spare{slot}_{self._started}"
        self._started += 1
        control = WorkerControl(self._root, slot, name)
        control.clear()
        log_dir = os.path.join(self._logs, name)
        os.makedirs(log_dir, exist_ok=True)
        overrides: dict[str, str | None] = {
            SPARE: str(slot),
            REPAIR_DIR: control.folder,
            RESUME_WAIT: str(resume_wait_s),
            "RANK": "-1",
            "ROLE_RANK": "-1",
            # a script that is not repairable fails at its first use of the group
            "MASTER_ADDR": None,
            "MASTER_PORT": None,
        }
        pid = spawn(slot, log_dir, overrides)
        error_file = os.path.join(log_dir, "error.json")
        self._spares[slot] = _Spare(slot, pid, control, error_file, self._wall())
        emit("spare_started", slot=slot, pid=pid, folder=control.folder)

    def _failed_on_its_own(self, spare: _Spare) -> bool:
        """A gone spare that wrote its error file failed before it reached the function
        (a stopped one did not): spares are off for this node, said once."""
        try:
            with open(spare.error_file) as handle:
                content = parse_error_file(handle.read(ERROR_FILE_LIMIT))
        except (OSError, RecordError):
            return False
        self._off = True
        logger.warning(
            "warm spare %d (pid %d) ended before it reached rtrain.repairable: %s; "
            "no more spares on this node (a spare needs a repairable script)",
            spare.slot,
            spare.pid,
            content.message or "no message",
        )
        emit("spares_off", slot=spare.slot, message=content.message)
        return True
