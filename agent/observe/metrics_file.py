"""--metrics-file: this node's metrics (core/observe/metrics.py) in a file that
node_exporter's textfile collector reads.

The file is rewritten whole, through a temporary file in the same folder and a rename,
so the collector never reads half of it: at every event, and with fresh readings (the
workers' heartbeat step, the snapshots' replication) at most every SAMPLE_S.
"""

from __future__ import annotations

import logging
import os
import time

from ...core.observe.events import Event
from ...core.observe.metrics import NodeMetrics

logger = logging.getLogger(__name__)

SAMPLE_S = 5.0


class MetricsFile:
    def __init__(self, path: str, run_id: str, agent: str) -> None:
        self.path = path
        self.metrics = NodeMetrics(run_id, agent)
        self._sampled = 0.0
        self._failed = False

    def on_event(self, event: Event) -> None:
        self.metrics.apply(event)
        self.write()

    def due(self) -> bool:
        """Whether fresh readings are wanted (at most every SAMPLE_S)."""
        return time.monotonic() - self._sampled >= SAMPLE_S

    def sample(self, step: int | None, committed: int | None, replicated: int | None) -> None:
        self._sampled = now = time.monotonic()
        self.metrics.sample(now, step, committed, replicated)
        self.write()

    def write(self) -> None:
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
