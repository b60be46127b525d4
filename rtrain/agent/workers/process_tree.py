"""--kill-process-tree: processes a worker started do not outlive it.

torchrun stops its workers and leaves whatever they started running (a data server,
`sleep` in a shell script, a daemon that detached). With --kill-process-tree the agent
makes itself the child subreaper (prctl PR_SET_CHILD_SUBREAPER), so that everything
under it that loses its parent is reparented to the agent instead of init, even a
double-forked daemon in its own session; after the workers of a generation are
stopped, and when the job ends, every such leftover gets SIGTERM, then SIGKILL after a
grace, and is reaped. Linux only; elsewhere the flag says so once and does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Collection

import psutil

from ...core.clock import Clock
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_leftovers(keep: Collection[int]) -> list[int]:
    """SIGTERM, then SIGKILL, every process under this one except `keep` and theirs;
    reap them; the pids that were found."""
    me = psutil.Process()
    kept = set(keep)
    for pid in keep:
        with contextlib.suppress(psutil.Error):
            kept.update(p.pid for p in psutil.Process(pid).children(recursive=True))
    try:
        found = [p for p in me.children(recursive=True) if p.pid not in kept]
    except psutil.Error:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in found:
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)
        _, alive = psutil.wait_procs(found, timeout=GRACE_S if sig == signal.SIGTERM else 1.0)
        if not alive:
            break
    reap_zombies()
    if found:
        logger.warning(
            "stopped %d process(es) the workers left behind: %s",
            len(found),
            ", ".join(str(p.pid) for p in found[:10]),
        )
    return [p.pid for p in found]


def reap_zombies() -> None:
    """Collect orphans reparented here that have exited (only zombies: the agent's own
    subprocess.Popen children are waited for by their owners)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)


class ZombieReaper:
    """Reaps exited orphans every EVERY_S from the monitor loop."""

    EVERY_S = 5.0

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._next = 0.0

    def poll(self) -> None:
        now = self._clock.now()
        if now >= self._next:
            self._next = now + self.EVERY_S
            reap_zombies()
