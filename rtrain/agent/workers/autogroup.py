"""The pool's session and its autogroup: what makes the warm-up idle beside the workers.

Where the kernel groups processes by session (kernel.sched_autogroup_enabled=1, the
default of most distributions' kernels), the CPU is shared between sessions first and
between the threads of a session second. A thread's SCHED_IDLE (or nice) then ranks it
only against the threads of its own session. Every worker is a session of its own
(setsid, as torchrun's), so the pool's SCHED_IDLE warm-up thread took as much CPU as a
busy worker on the same core: measured, pinned to one core beside a busy nice-0 process
in another session, it got 0.76 and 0.54 CPU-s to the process's 0.75 and 0.54 over 3 s;
in the process's own session, 0.00.

So the pool leads a session of its own (the agent's session, often the user's shell's,
keeps its priority), and while its warm-up runs at idle priority it sets its session's
autogroup nice to QUIET_NICE (weight 15 against a nice-0 session's 1024), back to what
it was when the warm-up ends or a spawn waits for it. An unprivileged process may raise
the value and set it back down to where it was; the kernel takes one change per 0.1 s
from it (EAGAIN), so a change is retried for up to RETRY_S.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time

AUTOGROUP = "/proc/self/autogroup"
QUIET_NICE = 19
RETRY_S = 0.3


def lead_own_session() -> bool:
    """Make this process (the pool) a session, hence an autogroup, of its own; whether it
    leads one now."""
    with contextlib.suppress(OSError):
        os.setsid()
    return os.getsid(0) == os.getpid()


def autogroup_nice(path: str = AUTOGROUP) -> int | None:
    """This session's autogroup nice ("/autogroup-N nice K"); None where there is none."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _write_nice(nice: int, path: str) -> bool:
    # The OS's clock, not the job's: the kernel's rate limit, in the pool's process too.
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            with open(path, "w") as handle:
                handle.write(str(nice))
            return True
        except OSError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() >= deadline:
                return False
        time.sleep(0.05)  # the kernel's one change per 0.1 s


class SessionNice:
    """The pool session's autogroup nice: quiet() while the warm-up runs, normal() after.
    Does nothing unless this process leads its session (it would change the agent's)."""

    def __init__(self, path: str = AUTOGROUP) -> None:
        self._path = path
        self._normal: int | None = None  # read at the first change, as the session is then
        self._lock = threading.Lock()

    def quiet(self) -> bool:
        return self._set(QUIET_NICE)

    def normal(self) -> bool:
        return self._set(None)

    def _set(self, nice: int | None) -> bool:
        with self._lock:
            if self._normal is None:
                if os.getsid(0) != os.getpid():
                    return False
                self._normal = autogroup_nice(self._path)
                if self._normal is None:
                    return False
            target = self._normal if nice is None else max(nice, self._normal)
            return _write_nice(target, self._path)
