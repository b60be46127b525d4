"""The agent's states, how a generation can end, and what a run returns."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

from ..core.rendezvous.decisions import GenerationEnd, Outcome
from ..core.rendezvous.failures import FailureRecord, root_cause_first
from .health.gpu_monitor import GpuFault
from .runtime_dir import write_failure_report


class AgentState(str, Enum):
    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class Ended:
    """How this node's generation ended, and the GPU fault that ended it, if one did."""

    outcome: Outcome
    fault: GpuFault | None = None

    @property
    def decision(self) -> GenerationEnd:
        excludes = self.fault is not None and self.fault.action.excludes_node
        return GenerationEnd(self.outcome, excludes)


@dataclass
class RunResult:
    state: AgentState
    exit_code: int
    message: str
    run_log_dir: str
    generation: int = 0
    failures: list[FailureRecord] = field(default_factory=list)

    @classmethod
    def ended(
        cls,
        state: AgentState,
        code: int,
        message: str,
        run_log_dir: str,
        generation: int,
        failures: list[FailureRecord] | None,
    ) -> RunResult:
        """The run's result, its failures root cause first, written to the failure report
        in run_log_dir when there are any."""
        ordered = root_cause_first(failures or [])
        if ordered:
            write_failure_report(run_log_dir, ordered)
        return cls(state, int(code), message, run_log_dir, generation, ordered)
