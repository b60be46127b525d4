"""A worker of a group (agent/workers/group.py), and what its end becomes: a
FailureRecord, from its error file, its hang and torch's flight recorder dumps."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from ...core.config.worker_env import FLIGHT_RECORDER_PREFIX, NodeAssignment, flight_recorder_note
from ...core.rendezvous.failures import FailureKind, FailureRecord, RecordError, parse_error_file
from .hang_watch import HangFinding

ERROR_FILE_LIMIT = 1 << 22  # an error file is a traceback: a few KiB


@dataclass
class Worker:
    local_rank: int
    rank: int
    log_dir: str
    error_file: str
    pid: int = 0
    exitcode: int | None = None
    exit_time: float = 0.0
    # Exits after the agent asked the group to stop are the agent's doing, not failures.
    stopped_by_agent: bool = False
    # Set when the agent found the worker hung and killed it: why, its stack, its part.
    hang: HangFinding | None = None
    # Stopped because it did not answer a repair in place (agent/repair/): not a failure.
    left_out: bool = False

    @property
    def worker_id(self) -> str:
        return str(self.local_rank)


def failure_record(
    worker: Worker, assignment: NodeAssignment, host: str, stopped: bool = False
) -> FailureRecord:
    """What the worker's end becomes: its error file's message, or its hang's, as the
    kind of end it was (stopped: by the agent, for the final report)."""
    message, trace = "", ""
    if os.path.exists(worker.error_file):
        try:
            with open(worker.error_file) as handle:
                content = parse_error_file(handle.read())
            message, trace = content.message, content.traceback
        except (OSError, RecordError) as exc:
            message = f"unreadable error file ({exc})"
    assert worker.exitcode is not None
    if worker.hang is not None:
        message, trace = worker.hang.message, worker.hang.stack
    note = flight_recorder_note(flight_recorder_dumps(worker.log_dir))
    message = f"{message} {note}".strip() if note else message
    kind = (
        FailureKind.STOPPED
        if stopped
        else FailureKind.HANG
        if worker.hang is not None
        else FailureKind.SIGNAL
        if worker.exitcode < 0
        else FailureKind.EXIT
    )
    return FailureRecord(
        kind=kind,
        generation=assignment.generation,
        node_rank=assignment.node_rank,
        host=host,
        # a hang happened when the worker went silent (or was first seen held)
        time=worker.hang.fault_time if worker.hang is not None else worker.exit_time,
        local_rank=worker.local_rank,
        rank=worker.rank,
        pid=worker.pid,
        exitcode=worker.exitcode,
        message=message,
        traceback=trace,
        error_file=worker.error_file if os.path.exists(worker.error_file) else "",
    )


def flight_recorder_dumps(log_dir: str) -> list[str]:
    """The flight recorder's dumps torch left in a worker's log folder (a NCCL watchdog
    timeout or collective error writes one per rank), sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(log_dir), f"{FLIGHT_RECORDER_PREFIX}*")))


def stopped_clean(worker: Worker, stop_time: float) -> bool:
    """Whether a worker that exited after its group's stop (begun at stop_time, wall
    clock) ended by the stop. Yes unless it had already written its error file: it was
    failing on its own (a peer's crash broke its collective, say) and only took longer
    to exit than the agent took to stop it. A file the stop cut off half-written (not
    JSON) says nothing of its own failure: the stop's (seen under load: a victim counted
    as a root cause)."""
    try:
        written = os.stat(worker.error_file).st_mtime
        with open(worker.error_file, "rb") as handle:
            json.loads(handle.read(ERROR_FILE_LIMIT))
    except OSError:
        return True
    except ValueError:  # torn by the stop
        return True
    return written >= stop_time
