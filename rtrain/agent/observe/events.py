"""The agent's structured events (core/observe/events.py says what each one holds).

One sink per process, like logging's: the agent opens it on its run log folder, and
any module calls emit(name, **fields); the node rank and generation of the log
context are stamped on every event. An event is one write of one line, flushed, so
tools can follow the file while the job runs, and nothing is kept in memory. Listeners
(the metrics file) see each event as it is written, with --events off too. With
neither a file nor a listener, emit() does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import IO, Any

from ...core.observe.events import EVENTS_FILE, Event, EventError, event_line, parse_event
from ...core.rendezvous.failures import FailureRecord, is_collective_victim
from ..waiting import SYSTEM_CLOCK
from . import log

logger = logging.getLogger(__name__)

Listener = Callable[[Event], None]


class EventLog:
    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self._agent = ""
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self.path: str | None = None
        # stamps each event: the process's wall clock until an agent hands its own
        self.wall: Callable[[], float] = SYSTEM_CLOCK.wall

    def open(self, run_log_dir: str, agent: str) -> str | None:
        """Start appending to <run_log_dir>/events.jsonl; its path, or None if it cannot
        be written (one warning: events are a view of the job, never its reason to fail)."""
        path = os.path.join(run_log_dir, EVENTS_FILE)
        try:
            handle = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed in close())
        except OSError as exc:
            logger.warning("no structured events: cannot write %s (%s)", path, exc.strerror)
            return None
        with self._lock:
            self._file, self._agent, self.path = handle, agent, path
        return path

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self, agent: str, wall: Callable[[], float] = SYSTEM_CLOCK.wall) -> None:
        """Name the node events carry, for listeners without a file (--events off);
        wall: the agent's wall clock, which stamps them (its Clock.wall)."""
        self._agent, self.wall = agent, wall

    def emit(self, name: str, **fields: Any) -> None:
        if self._file is None and not self._listeners:
            return
        context = log.CONTEXT
        try:
            line = event_line(
                name, self.wall(), self._agent, context.node_rank, context.generation_number, fields
            )
        except EventError as exc:  # a bug in rtrain, not in the job: say so, go on
            logger.error("event not written: %s", exc)
            return
        with self._lock:
            try:
                if self._file is not None:
                    self._file.write(line)
                    self._file.flush()
            except OSError as exc:
                logger.warning("structured events stop here: %s (%s)", self.path, exc.strerror)
                self._close_file()
        event = parse_event(line)
        assert event is not None
        for listener in self._listeners:
            listener(event)

    def close(self) -> None:
        with self._lock:
            self._close_file()
        self._listeners.clear()
        self.wall = SYSTEM_CLOCK.wall

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


EVENTS = EventLog()


def emit(name: str, **fields: Any) -> None:
    """Write one event to this process's sink (nothing before it is opened)."""
    EVENTS.emit(name, **fields)


def emit_failure(
    record: FailureRecord, detect_s: float | None = None, fault_t: float | None = None
) -> None:
    """A `fault` event for a failure this node recorded in the store; fault_t: when it
    happened, where that is known better than the record's time."""
    fields: dict[str, Any] = {
        "kind": str(record.kind),
        "rank": record.rank,
        "local_rank": record.local_rank,
        "fault_node": record.node_rank,
        "host": record.host,
        "fault_t": record.time if fault_t is None else fault_t,
        "message": record.message,
        "exitcode": record.exitcode,
        # a consequence of another rank's fault (its collective broke under it)
        "victim": is_collective_victim(record),
    }
    detected = EVENTS.wall() - record.time if detect_s is None else detect_s
    fields["detect_s"] = round(max(detected, 0.0), 6)
    emit("fault", **fields)
