"""The pool's warm-up: modules imported at idle priority once the pool is idle, so that
restarted workers find them imported (see WorkerPool's warm_later).

A Python worker must not be forked while the warm-up thread is inside an import: the
child would deadlock on that module's lock, or find the module half done. A spawn that
comes meanwhile waits for the warm-up only while it makes progress (it gets CPU time)
and at most WAIT_S; a warm-up starved at idle priority by a loaded node (4 busy loops
on 2 cores: still importing after 30 s) is not waited for, and the worker starts as a
fresh interpreter instead.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time

from .autogroup import SessionNice

# The longest a spawn waits for a warm-up that makes progress: a fresh interpreter's
# `import torch` costs about as much, and it imports torch._dynamo again later.
WAIT_S = 5.0
# A warm-up that got less than MIN_SHARE of a core over a window of WINDOW_S is starved.
WINDOW_S = 0.25
MIN_SHARE = 0.2
# A warm-up given up on is not waited for again this long (a group's other spawns).
REGIVE_S = 1.0
# The pool's session's autogroup nice, raised while the idle-priority warm-up runs: a
# SCHED_IDLE thread is idle only against its own session's threads (autogroup.py).
_SESSION = SessionNice()


def preload(modules: list[str]) -> dict[str, str]:
    errors: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a failed preload only costs speed; report it
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def _warm_at_idle_priority(modules: list[str]) -> None:
    """Import `modules` in this thread at SCHED_IDLE (a per-thread policy on Linux): the
    first generation's workers are running by then, and on a small node a full-priority
    import of torch._dynamo (1-3 s of CPU) slowed their first steps. Workers are forked
    from the main thread, whose policy stays as it was."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    _SESSION.quiet()
    try:
        preload(modules)
    finally:
        _SESSION.normal()


class WarmUp:
    def __init__(self, modules: list[str], idle: bool = True) -> None:
        """idle: at SCHED_IDLE (beside this node's running workers); False: at the
        normal priority (a standby node: no workers of its own to slow down, and a
        warm-up starved by a loaded machine left its takeover a fresh interpreter)."""
        target = _warm_at_idle_priority if idle else preload
        self._thread = threading.Thread(target=target, args=(modules,), daemon=True)
        self._thread.start()
        self._gave_up = -float("inf")

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def hurry(self) -> None:
        """Go on at the normal priority, where the system allows (a standby node)."""
        self._set_policy("SCHED_OTHER")

    def finish(self) -> bool:
        """Wait for the warm-up while it progresses, up to WAIT_S; whether it is done.
        It is first lifted to normal priority where the system allows (root, or a
        RLIMIT_NICE that does): a spawn is waiting on it now."""
        if not self._thread.is_alive():
            return True
        # The OS's clock: this runs in the pool's process (zygote.py), not on the job's.
        if time.monotonic() - self._gave_up < REGIVE_S:
            return False  # the rest of a group's spawns: it was starved a moment ago
        self._set_policy("SCHED_OTHER")
        clock = self._cpu_clock()
        deadline = time.monotonic() + WAIT_S
        used = _cpu_time(clock)
        while time.monotonic() < deadline:
            self._thread.join(WINDOW_S)
            if not self._thread.is_alive():
                return True
            now = _cpu_time(clock)
            if now is None or used is None or now - used < MIN_SHARE * WINDOW_S:
                break  # starved (or no way to tell): not worth waiting for
            used = now
        if self._thread.is_alive():  # back to idle: the worker that starts now comes first
            self._set_policy("SCHED_IDLE")
            self._gave_up = time.monotonic()
            if not self._thread.is_alive():  # it ended meanwhile: the session back too
                _SESSION.normal()
            return False
        return True

    def _set_policy(self, name: str) -> None:
        """The thread's policy, and its session's autogroup nice to match."""
        if name == "SCHED_IDLE":
            _SESSION.quiet()
        else:
            _SESSION.normal()
        native_id = self._thread.native_id
        if native_id is None:
            return
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(native_id, getattr(os, name), os.sched_param(0))

    def _cpu_clock(self) -> int | None:
        ident = self._thread.ident
        if ident is None:
            return None
        try:
            return time.pthread_getcpuclockid(ident)
        except (AttributeError, OSError):
            return None


def _cpu_time(clock: int | None) -> float | None:
    if clock is None:
        return None
    try:
        return time.clock_gettime(clock)
    except OSError:  # the thread ended between the check and the read
        return None
