"""A warm spare worker (rtrain launch --spares-per-node N; agent/repair/warm_spares.py).

The agent starts a spare as it starts any worker, with RTRAIN_SPARE set, RANK -1 and no
MASTER_ADDR. It runs the script's start-up (imports, module level, model construction)
ahead of any fault; on entering the repairable function it says "parked" in its own
control folder and waits there, with no time limit, for the resume addressed to its
pid. That names the rank it takes and the whole environment of that rank's new worker
(RANK, WORLD_SIZE, MASTER_ADDR, its control folder, its error and heartbeat files...).
From then on it is that rank's new worker, already warm: under train-through it says it
is ready at once and joins the kept ranks at their next step boundary
(core/worker/repair/through.py); otherwise it meets the parked survivors in the
generation's group. A script that never calls rtrain.repairable cannot use a spare: it
fails at its first use of the process group (no MASTER_ADDR) and the agent stops
starting spares (it says so).

What a spare holds: a process with the script's imports and module-level objects (host
memory). Its LOCAL_RANK until it takes a rank is local world size + slot (on a GPU node,
a free device, for what its module level puts there); the resume gives it the failed
rank's LOCAL_RANK, whose device the failed process left, so device work belongs inside
the function, after torch.cuda.set_device(LOCAL_RANK), as in any repairable script.
"""

from __future__ import annotations

import os
from typing import Protocol

from ...contract.environment import RTRAIN_GENERATION, SPARE
from ...contract.repair_files import PARKED, Resume

# How often a waiting spare reads its control folder: it may wait for hours, so not
# the parked survivors' 10 ms; a join waits for the kept ranks' next step anyway.
SPARE_POLL_S = 0.05


class SpareControl(Protocol):
    def say(self, state: str, generation: int) -> None: ...

    def wait_resume(
        self, generation: int, timeout_s: float | None = ..., poll_s: float = ...
    ) -> Resume | None: ...


def is_spare() -> bool:
    return SPARE in os.environ


def take_rank(control: SpareControl) -> int:
    """Wait, parked, until the agent gives this spare a rank; enter that rank's
    environment. The generation it enters."""
    generation = int(os.environ.get(RTRAIN_GENERATION, "0") or 0)
    control.say(PARKED, generation)
    resume = control.wait_resume(generation, None, SPARE_POLL_S)
    assert resume is not None  # no time limit: it returns with a resume
    del os.environ[SPARE]
    os.environ.update(resume.env)
    return resume.generation
