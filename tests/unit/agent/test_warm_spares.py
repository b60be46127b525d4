"""WarmSpares (agent/repair/warm_spares.py) over real control folders and error files:
which spare a take hands a rank, what a fill starts again, and a spare that failed on
its own turning spares off. The spawn and the processes' states are the test's."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from rtrain.agent.repair.warm_spares import WarmSpares
from rtrain.core.contract.environment import SPARE
from rtrain.core.contract.repair_files import (
    PARKED,
    REPAIR_DIR,
    RESUME_FILE,
    STATE_FILE,
    WorkerState,
    decode_resume,
    encode_state,
)
from rtrain.core.observe.events import Event


class Processes:
    """The spares the test 'started': pid -> its variables and log folder, and which are
    alive (psutil's state name, or None when gone)."""

    def __init__(self) -> None:
        self.started: dict[int, tuple[dict[str, str | None], str]] = {}
        self.state: dict[int, str | None] = {}

    def spawn(self, slot: int, log_dir: str, env: Mapping[str, str | None]) -> int:
        pid = 1000 + len(self.started)
        self.started[pid] = (dict(env), log_dir)
        self.state[pid] = "sleeping"
        return pid

    def park(self, pid: int) -> None:
        env = self.started[pid][0]
        folder = env[REPAIR_DIR]
        assert folder is not None
        Path(folder, STATE_FILE).write_bytes(encode_state(WorkerState(PARKED, 0, pid)))


def _spares(tmp_path: Path, procs: Processes, count: int = 2) -> WarmSpares:
    root, logs = tmp_path / "repair", tmp_path / "logs"
    root.mkdir()
    return WarmSpares(count, str(root), str(logs), procs.state.get, lambda: 500.0)


def test_a_take_hands_a_parked_spare_the_rank_and_the_next_fill_replaces_it(
    tmp_path: Path, events: list[Event]
) -> None:
    procs = Processes()
    spares = _spares(tmp_path, procs)
    spares.fill(procs.spawn, 60.0)
    first, second = sorted(procs.started)
    env = procs.started[first][0]
    assert env[SPARE] == "0" and env["RANK"] == "-1" and env["MASTER_ADDR"] is None
    procs.park(second)  # slot 1's spare is warm, slot 0's still starting
    assert spares.take(3, 5, {"RANK": "5", "WORLD_SIZE": "8"}) == second
    folder = procs.started[second][0][REPAIR_DIR]
    assert folder is not None
    resume = decode_resume(Path(folder, RESUME_FILE).read_bytes())
    assert resume is not None and (resume.generation, resume.pid) == (3, second)
    assert resume.env["RANK"] == "5"
    # next, the one still starting (it reads the hand-over when it reaches the function)
    assert spares.take(3, 6, {"RANK": "6"}) == first
    assert spares.take(3, 7, {"RANK": "7"}) is None  # none left
    taken = [e for e in events if e.name == "spare_taken"]
    assert [(e["rank"], e["parked"]) for e in taken] == [(5, True), (6, False)]
    spares.fill(procs.spawn, 60.0)  # both slots again, each in a folder of its own
    assert len(procs.started) == 4
    folders = {procs.started[pid][0][REPAIR_DIR] for pid in procs.started}
    assert len(folders) == 4


def test_a_spare_killed_by_a_stop_is_started_again(tmp_path: Path) -> None:
    procs = Processes()
    spares = _spares(tmp_path, procs, count=1)
    spares.fill(procs.spawn, 60.0)
    (pid,) = procs.started
    procs.state[pid] = None  # SIGKILLed with the workers: no error file
    assert spares.take(1, 0, {"RANK": "0"}) is None  # a gone spare is never handed a rank
    spares.fill(procs.spawn, 60.0)
    assert len(procs.started) == 2


def test_a_spare_that_failed_on_its_own_turns_spares_off(
    tmp_path: Path, events: list[Event]
) -> None:
    """A plain script's spare fails at its first use of the process group (no
    MASTER_ADDR) and writes its error file: said once, no spare started again."""
    procs = Processes()
    spares = _spares(tmp_path, procs, count=1)
    spares.fill(procs.spawn, 60.0)
    (pid,) = procs.started
    log_dir = procs.started[pid][1]
    message = "environment variable MASTER_ADDR expected, but not set"
    error = {"message": {"message": message, "extraInfo": {"timestamp": "0"}}}
    Path(log_dir, "error.json").write_text(json.dumps(error))
    procs.state[pid] = None
    spares.fill(procs.spawn, 60.0)
    spares.fill(procs.spawn, 60.0)
    assert len(procs.started) == 1
    (off,) = [e for e in events if e.name == "spares_off"]
    assert off["slot"] == 0 and "MASTER_ADDR" in off["message"]
    assert os.path.isdir(log_dir)
