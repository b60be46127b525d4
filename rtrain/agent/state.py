"""The agent's states, how a generation can end, and what a run returns."""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType
from typing import Any, Protocol

from ..core.rendezvous.decisions import GenerationEnd, Outcome
from ..core.rendezvous.failures import FailureKind, FailureRecord, root_cause_first
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


class SignalLatch:
    """The signals the agent handles: a handler only notes the signal, and the loop
    raises Interrupted at its next check, a point where it can act (stop workers, save,
    leave), never inside whatever the signal interrupted."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self, signums: Iterable[int]) -> None:
        for signum in signums:
            self._previous[signum] = signal.signal(signum, self._note)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class NodeFault(Protocol):
    """What ends a generation on this node and may take it out of the job: a GPU fault
    (agent/health/gpu_monitor.py) or a lasting straggler (agent/observe/stragglers.py)."""

    @property
    def excludes_node(self) -> bool: ...

    @property
    def failure_kind(self) -> FailureKind: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Ended:
    """How this node's generation ended, and the fault of its own that ended it, if one
    did (a GPU's, or a lasting straggler's)."""

    outcome: Outcome
    fault: GpuFault | NodeFault | None = None

    @property
    def decision(self) -> GenerationEnd:
        excludes = self.fault is not None and self.fault.excludes_node
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
