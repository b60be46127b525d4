"""HealthGuard: what the agent does about its GPUs.

- Before joining a generation: every check. A node whose GPUs call for a reset, a
  reboot or service stays out (and says why).
- While training: the GpuMonitor's faults. An application-level XID (13, 31, 43, ...)
  restarts the workers, and the node stays. A fault that calls for a reset, a reboot
  or service takes the node out of the job: it declares itself lost in the store (the
  agent's JobRendezvous.leave, the one place a node is declared lost), so
  the survivors go on at once instead of waiting for its lease to expire, records the
  finding in the failure report, and, with --drain-on-fault under Slurm, drains itself.
- Without an NVIDIA driver there is nothing to watch: the guard is off, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from ...core.clock import Clock
from ...core.config.launch_spec import HealthSpec
from ...core.health.gpu_health import Thresholds
from ...core.health.gpu_inventory import expected_gpus
from ...core.rendezvous.failures import FailureKind, FailureRecord
from ..observe.events import emit
from ..waiting import SYSTEM_CLOCK
from .drain import DrainError, drain_node, slurm_node_name
from .gpu_monitor import GpuFault, GpuMonitor, faults_of
from .nvml_reader import NvmlUnavailable, open_nvml

logger = logging.getLogger(__name__)


class HealthGuard:
    def __init__(
        self, monitor: GpuMonitor, drain_as: str | None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._monitor = monitor
        self._drain_as = drain_as  # the Slurm node name to drain, or None
        self._clock = clock  # a record's time (wall)

    @classmethod
    def open(
        cls, spec: HealthSpec, environ: Mapping[str, str], clock: Clock = SYSTEM_CLOCK
    ) -> HealthGuard | None:
        """The guard for this node, or None when checks are off or there is no driver.
        A malformed fake-NVML scenario or --drain-on-fault outside Slurm is a UsageError."""
        if spec.interval <= 0:
            return None
        drain_as = slurm_node_name(environ) if spec.drain_on_fault else None
        try:
            nvml = open_nvml(environ)
        except NvmlUnavailable as exc:
            logger.info("GPU health checks off: %s", exc)
            return None
        expected = expected_gpus(environ)
        monitor = GpuMonitor(nvml, Thresholds(), expected, spec.interval, environ, clock)
        monitor.start()
        return cls(monitor, drain_as, clock)

    def before_join(self) -> GpuFault | None:
        """A fault that keeps this node out of the next generation, if any."""
        report = self._monitor.check()
        faults = faults_of(report)
        emit("gpu", verdict=report.verdict.label, findings=[f.describe() for f in faults])
        excluding = [f for f in faults if f.action.excludes_node]
        for fault in faults:
            logger.warning("GPU check before joining: %s", fault.describe())
        return excluding[0] if excluding else None

    def poll(self) -> GpuFault | None:
        fault = self._monitor.poll()
        if fault is not None:
            emit("gpu", verdict=fault.result.verdict.label, findings=[fault.describe()])
        return fault

    def record(self, fault: GpuFault, generation: int, node_rank: int, host: str) -> FailureRecord:
        return fault_record(fault, generation, node_rank, host, self._clock.wall())

    def drain(self, fault: GpuFault) -> None:
        if self._drain_as is None:
            return
        try:
            drain_node(self._drain_as, f"rtrain: {fault.describe()}")
        except DrainError as exc:
            logger.error("%s", exc)

    def close(self) -> None:
        self._monitor.close()


class Fault(Protocol):
    """A fault of this node's own (agent/state.py's NodeFault)."""

    @property
    def failure_kind(self) -> FailureKind: ...

    def describe(self) -> str: ...


def fault_record(
    fault: Fault, generation: int, node_rank: int, host: str, wall: float
) -> FailureRecord:
    return FailureRecord(
        kind=fault.failure_kind,
        generation=generation,
        node_rank=node_rank,
        host=host,
        time=wall,
        message=fault.describe(),
    )


def leave_job(
    fault: Fault,
    generation: int,
    node_rank: int | None,
    host: str,
    tell: Callable[[FailureRecord], None],
    wall: float,
) -> FailureRecord:
    """Take this node out: tell the others (tell: JobRendezvous.leave, the one place a
    node is declared lost; only when it was a member)."""
    record = fault_record(fault, generation, node_rank if node_rank is not None else -1, host, wall)
    logger.error("leaving the job: %s", fault.describe())
    if node_rank is not None:
        tell(record)
    return record
