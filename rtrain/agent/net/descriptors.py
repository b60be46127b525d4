"""Running out of file descriptors: an error the agent logs and survives.

Every file, socket and pipe the agent opens takes a descriptor, and the limit
(RLIMIT_NOFILE) is shared with whatever else runs in the agent: its servers' clients,
the store's connections, the workers' log files. When the table is full any open fails
with EMFILE (ENFILE for the system's table), wherever it happens to be. The agent then
treats its generation as failed on this node (the others restart with it, as for a
failed worker) and tries again after a back-off, instead of dying with a traceback; only
a shortage that lasts MAX_IN_A_ROW generations ends the node, as a temporary failure.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections.abc import Callable

from ...core.clock import Clock
from ...core.errors import ExitCode, RtrainError
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

MAX_IN_A_ROW = 5
# Before it acts (stops its workers, tells the others) the agent waits for this many
# descriptors to be free: acting takes some, and without them it would fail again.
SPARE_NEEDED = 8
SPARE_POLL_S = 0.2


# EMFILE met in one of the agent's threads (a server's handler, the replicator), for the
# generation loop to act on: the descriptor table is the process's, so a shortage is the
# node's whichever thread met it, and only the loop can restart the node's part.
_met_in_thread: list[OSError] = []
_met_lock = threading.Lock()


def ran_out_in_thread(exc: OSError) -> None:
    """A thread of the agent ran out of descriptors: the generation loop raises it
    (raise_if_ran_out_in_thread) at its next pass, once however many threads met it."""
    with _met_lock:
        if not _met_in_thread:
            _met_in_thread.append(exc)


def raise_if_ran_out_in_thread() -> None:
    """The OSError a thread met since the last call, raised here, in the loop's thread."""
    with _met_lock:
        exc = _met_in_thread.pop() if _met_in_thread else None
    if exc is not None:
        raise OSError(exc.errno, exc.strerror)


class OutOfDescriptors(RtrainError):
    exit_code = ExitCode.TEMPFAIL


def is_out_of_descriptors(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def descriptor_use() -> str:
    """'N open, limit M' as far as it can be told without a descriptor to spare."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    try:
        opened = str(len(os.listdir("/proc/self/fd")))
    except OSError:  # listing the table needs a descriptor too
        opened = "?"
    return f"{opened} open, limit {limit}"


def have_spare(count: int = SPARE_NEEDED) -> bool:
    """Whether `count` descriptors can be opened now (they are closed again at once)."""
    opened: list[int] = []
    try:
        for _ in range(count):
            opened.append(os.open(os.devnull, os.O_RDONLY))
        return True
    except OSError as exc:
        if not is_out_of_descriptors(exc):
            raise
        return False
    finally:
        for fd in opened:
            os.close(fd)


class DescriptorShortage:
    """Counts the generations in a row that ran out of descriptors on this node."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.in_a_row = 0
        self._clock = clock

    def ran_out(self, exc: OSError, generation: int | None) -> None:
        """Log the shortage; OutOfDescriptors once it has lasted MAX_IN_A_ROW times."""
        self.in_a_row += 1
        where = "joining" if generation is None else f"in generation {generation}"
        logger.error(
            "this node ran out of file descriptors %s (%s; %s): restarting its part of "
            "the job (%d of %d in a row)",
            where,
            descriptor_use(),
            exc.strerror or exc,
            self.in_a_row,
            MAX_IN_A_ROW,
        )
        if self.in_a_row >= MAX_IN_A_ROW:
            raise OutOfDescriptors(
                f"out of file descriptors {MAX_IN_A_ROW} times in a row ({descriptor_use()}): "
                "raise the limit (ulimit -n) or find what holds them"
            )

    def wait_for_spare(self, timeout: float, check_stop: Callable[[], None]) -> None:
        """Wait until the agent has descriptors to act with; OutOfDescriptors after
        timeout (signals end the wait by raising from check_stop)."""

        def spare() -> bool:
            check_stop()
            return have_spare()

        if not self._clock.wait_until(spare, timeout, SPARE_POLL_S):
            raise OutOfDescriptors(
                f"no file descriptor came free within {timeout:g}s ({descriptor_use()}): "
                "raise the limit (ulimit -n) or find what holds them"
            )

    def started(self) -> None:
        """A generation ran: the streak is over."""
        self.in_a_row = 0
