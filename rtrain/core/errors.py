"""Exit codes shared by every rtrain command, and the errors that map onto them.

The table is the one in ARCHITECTURE.md; README.md documents it for users.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCESS = 0
    # The job failed and rtrain gave up (restarts exhausted, unrecoverable fault).
    JOB_FAILED = 1
    # Bad flag, bad value, contradictory environment: never a health verdict.
    USAGE = 64
    # The job cannot go on now but a requeue can (no quorum, store unreachable).
    TEMPFAIL = 75
    # The surviving nodes cannot hold the declared --tp/--pp layout: a requeue onto
    # the same nodes will not help, more nodes will.
    LAYOUT = 76
    # This node left the job: a GPU fault calls for a reset, a reboot or service. The
    # other nodes go on without it; requeue a single-node job elsewhere.
    NODE_UNHEALTHY = 77


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an error's message (at most `limit` characters), or its type's
    name if it has none: what a one-line report shows of a foreign exception."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


def exit_code_for_signal(signum: int) -> int:
    """Shell convention for "terminated by signal N", used when rtrain itself is signalled."""
    return 128 + signum


class RtrainError(Exception):
    """An error with a one-line message for the user and the exit code it maps to."""

    exit_code: int = ExitCode.JOB_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(RtrainError):
    """A bad command line or contradictory configuration."""

    exit_code = ExitCode.USAGE


class RendezvousError(RtrainError):
    """The nodes could not form a generation (timeout, unreachable store): requeue may help."""

    exit_code = ExitCode.TEMPFAIL


class StoreUnavailable(RendezvousError):
    """The rendezvous store is gone, stopped or cut off: no call to it can succeed."""


class JobFinished(RtrainError):
    """The job ended successfully while this node was away (stopped, fenced, late): there
    is nothing left to join, and nothing failed."""

    exit_code = ExitCode.SUCCESS


class RendezvousTimeout(RendezvousError):
    """Too few nodes joined a generation within join_timeout."""

    def __init__(self, message: str, generation: int) -> None:
        super().__init__(message)
        self.generation = generation
