"""--metrics-file: this node's metrics (core/observe/metrics.py) in a file that
node_exporter's textfile collector reads.

The file is rewritten whole, through a temporary file in the same folder and a rename,
so the collector never reads half of it: at every event, and with fresh readings (the
workers' heartbeat step, the snapshots' replication) at most every SAMPLE_S.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import threading

from ...core.clock import Clock
from ...core.observe.badput.node import LiveBeats
from ...core.observe.events import Event
from ...core.observe.metrics import NodeMetrics
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

SAMPLE_S = 5.0


class MetricsFile:
    """This node's metrics: folded from its events, kept in a file (path None: only
    in memory, for --metrics-port), and read whole by exposition() from any thread."""

    def __init__(
        self, path: str | None, run_id: str, agent: str, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        """clock: when readings are due (now), and their times (now and wall)."""
        self.path = path
        self._clock = clock
        self.metrics = NodeMetrics(run_id, agent, build=build_labels())
        self._sampled = 0.0
        self._failed = False
        # Events come from the agent's thread and the replicator's, scrapes from the
        # HTTP server's: one at a time, and one writer of the temporary file.
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        with self._lock:
            self.metrics.apply(event)
            self._write()

    def exposition(self) -> str:
        with self._lock:
            return self.metrics.exposition()

    def due(self) -> bool:
        """Whether fresh readings are wanted (at most every SAMPLE_S)."""
        return self._clock.now() - self._sampled >= SAMPLE_S

    def sample(
        self,
        step: int | None,
        committed: int | None,
        replicated: int | None,
        beats: LiveBeats | None = None,
    ) -> None:
        """beats: the running generation's first heartbeat step and newest, when seen
        (wall clock): its training time so far, for the time by cause."""
        with self._lock:
            self._sampled = now = self._clock.now()
            wall = self._clock.wall()
            self.metrics.sample(now, step, committed, replicated, wall=wall, beats=beats)
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(self.metrics.exposition())
            os.replace(temporary, self.path)
        except OSError as exc:
            if not self._failed:  # once: metrics are a view of the job, never its end
                logger.warning("cannot write the metrics file %s (%s)", self.path, exc.strerror)
            self._failed = True
            return
        self._failed = False


def build_labels() -> dict[str, str]:
    """rtrain_build_info's labels: rtrain's, torch's and Python's versions (from the
    installed packages' metadata: the agent need not import torch for them)."""
    return {
        "version": _version("rtrain"),
        "torch": _version("torch"),
        "python": platform.python_version(),
    }


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
