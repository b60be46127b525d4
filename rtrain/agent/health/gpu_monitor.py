"""GpuMonitor: this node's GPUs, sampled in the background, XIDs as they come.

The agent's monitor loop calls poll() every few hundred milliseconds; it never touches
NVML itself (a driver call can block for seconds on a sick GPU). The sampling thread
runs every check each interval; the XID listener hands over events at once, so an XID
79 is acted on within one poll, not one interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.clock import Clock
from ...core.health.gpu_health import (
    CheckResult,
    GpuSample,
    HealthReport,
    Thresholds,
    Verdict,
    XidEvent,
    evaluate_node,
)
from ...core.health.gpu_inventory import watched_gpus
from ...core.health.xid import Action
from ...core.rendezvous.failures import FailureKind
from ..waiting import SYSTEM_CLOCK
from .nvml_reader import NvmlReader, XidListener

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuFault:
    """A finding the agent acts on: restart the workers, or take the node out."""

    gpu: int | None  # None: the node (a missing GPU)
    name: str
    uuid: str
    result: CheckResult

    @property
    def action(self) -> Action:
        return self.result.action

    @property
    def excludes_node(self) -> bool:
        return self.action.excludes_node

    @property
    def failure_kind(self) -> FailureKind:
        return FailureKind.UNHEALTHY_GPU

    def describe(self) -> str:
        where = "node" if self.gpu is None else f"GPU {self.gpu} ({self.uuid})"
        return f"{where}: {self.result.check}: {self.result.reading} -> {self.action.value}"


def faults_of(report: HealthReport) -> list[GpuFault]:
    """The findings that call for an action, most severe first."""
    names = {g.index: (g.name, g.uuid) for g in report.gpus}
    faults = [
        GpuFault(gpu, *(names.get(gpu, ("?", "?")) if gpu is not None else ("?", "?")), result)
        for gpu, result in report.findings()
        if result.action is not Action.NONE
    ]
    return sorted(faults, key=lambda f: -f.action.rank)


class GpuMonitor:
    def __init__(
        self,
        nvml: Any,
        thresholds: Thresholds,
        expected: int | None,
        interval: float,
        environ: Mapping[str, str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """clock: what a sample cost (now), the XIDs' times (wall); the sampling thread
        waits on its own event, a real interval."""
        self._clock = clock
        self._reader = NvmlReader(nvml)
        self._environ = environ or {}
        identities = [
            GpuSample(i, uuid=self._reader.uuid_of(i)) for i in range(self._reader.count())
        ]
        # Only this job's GPUs count (CUDA_VISIBLE_DEVICES); XIDs of others are ignored.
        self._watched = {s.index for s in watched_gpus(identities, self._environ)}
        self._thresholds = thresholds
        self._expected = expected
        self._interval = interval
        self._xids = XidListener(nvml, self._reader.count(), clock.wall)
        self._lock = threading.Lock()
        self._pending: list[HealthReport] = []
        self._reported: set[tuple[int | None, str, str]] = set()  # gpu, check, verdict
        self._closed = threading.Event()
        self.sample_seconds: list[float] = []  # what each periodic sample cost
        self._thread = threading.Thread(target=self._run, name="rtrain-gpu", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self, xids: list[XidEvent] | None = None) -> HealthReport:
        """Every check now, with the XIDs that arrived since the last check or poll."""
        samples = watched_gpus(self._reader.sample_all(), self._environ)
        events = self._xids.take() if xids is None else xids
        events = [e for e in events if e.gpu in self._watched or e.gpu < 0]
        _attach(samples, events)
        return evaluate_node(samples, self._expected, self._thresholds)

    def _run(self) -> None:
        while not self._closed.wait(self._interval):
            started = self._clock.now()
            try:
                report = self.check(xids=[])  # XIDs go through poll(), at once
            except Exception as exc:  # the agent must outlive a broken driver
                logger.warning("GPU health sample failed: %s", exc)
                continue
            self.sample_seconds.append(self._clock.now() - started)
            with self._lock:
                self._pending.append(report)

    def poll(self) -> GpuFault | None:
        """The most severe new fault since the last poll, if any; warnings are logged
        once per GPU, check and reading."""
        events = [e for e in self._xids.take() if e.gpu in self._watched or e.gpu < 0]
        with self._lock:
            reports, self._pending = self._pending, []
        if events:
            reports.append(self._xid_report(events))
        faults: list[GpuFault] = []
        for report in reports:
            for gpu, result in report.findings():
                key = (gpu, result.check, result.verdict.label)
                if key in self._reported:
                    continue
                self._reported.add(key)
                where = "node" if gpu is None else f"GPU {gpu}"
                if result.verdict is Verdict.UNKNOWN:
                    logger.warning(
                        "%s: %s could not be read (%s)", where, result.check, result.reading
                    )
                elif result.action is Action.NONE:
                    logger.warning("%s: %s: %s", where, result.check, result.reading)
            faults += faults_of(report)
        return max(faults, key=lambda f: f.action.rank, default=None)

    def _xid_report(self, events: list[XidEvent]) -> HealthReport:
        """The XID findings alone, without sampling (a lost GPU may block a sample)."""
        gpus = sorted({e.gpu for e in events})
        samples = [GpuSample(i, uuid=self._uuid(i), readings={}) for i in gpus]
        _attach(samples, events)
        report = evaluate_node(samples, None, self._thresholds)
        for gpu in report.gpus:
            gpu.checks = [c for c in gpu.checks if c.check == "xid"]
        report.node_checks = []
        return report

    def _uuid(self, index: int) -> str:
        return self._reader.uuid_of(index)

    def close(self) -> None:
        self._closed.set()
        self._xids.close()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 1)


def _attach(samples: list[GpuSample], events: list[XidEvent]) -> None:
    by_index = {s.index: s for s in samples}
    for event in events:
        sample = by_index.get(event.gpu)
        if sample is None:  # an XID for a GPU that no longer answers: report it anyway
            sample = by_index[event.gpu] = GpuSample(event.gpu)
            samples.append(sample)
        sample.xids.append(event)
