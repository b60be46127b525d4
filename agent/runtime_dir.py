"""The agent's folders: the run's log folder, and its per-run folder in shared memory
(sweeping the ones dead agents left).

An agent that is SIGKILLed (or whose node is OOM-killed) cannot remove its folder, and
on /dev/shm that folder holds every snapshot slot and replica: gigabytes of memory that
nothing would ever free. Each folder is named after its agent's pid, so a new agent
removes the folders of agents that are no longer running.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import tempfile

import psutil
from rtrain.core.failures import FailureRecord
from rtrain.core.launch_spec import LaunchSpec

logger = logging.getLogger(__name__)

# Distinct from the log folders ("rtrain_<random>") that may share /tmp with these.
PREFIX = "rtrain-run-"
OWNED = re.compile(PREFIX + r"(\d+)-[^/]+$")


def make_run_log_dir(spec: LaunchSpec) -> str:
    base = spec.log_dir or tempfile.mkdtemp(prefix="rtrain_")
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{spec.rdzv.run_id}_", dir=base)


FAILURE_REPORT = "failures.json"


def write_failure_report(run_log_dir: str, failures: list[FailureRecord]) -> None:
    """<run_log_dir>/failures.json: the report's records, root cause first, for tools."""
    path = os.path.join(run_log_dir, FAILURE_REPORT)
    try:
        with open(path, "w") as handle:
            handle.write("[\n" + ",\n".join(r.encode() for r in failures) + "\n]\n")
    except OSError as exc:  # the report on the console still has everything
        logger.warning("could not write %s (%s)", path, exc.strerror)


def make_runtime_dir() -> str:
    """A new folder for this agent, memory-backed where /dev/shm exists."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    sweep_dead(base)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)


def sweep_dead(base: str) -> list[str]:
    """Remove this user's agent folders whose agent is gone; the paths removed."""
    removed = []
    for path in glob.glob(os.path.join(base, PREFIX + "*")):
        match = OWNED.search(path)
        if match is None or not _ours(path) or psutil.pid_exists(int(match[1])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("freed %d folder(s) left by agents that died: %s", len(removed), removed)
    return removed


def _ours(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.getuid()
    except OSError:
        return False
