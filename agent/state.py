"""The agent's states, how a generation can end, and what a run returns."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

from ..core.rendezvous.failures import FailureRecord


class AgentState(str, Enum):
    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    LOCAL_FAILURE = "local failure"
    MEMBERSHIP_CHANGE = "membership change"
    GPU_FAULT = "GPU fault"


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class RunResult:
    state: AgentState
    exit_code: int
    message: str
    run_log_dir: str
    generation: int = 0
    failures: list[FailureRecord] = field(default_factory=list)
