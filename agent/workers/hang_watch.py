"""Hang detection: workers' heartbeat files, and the stack of a worker that stopped.

Each worker gets a small file that rtrain.core.heartbeat() bumps through a shared
mapping; the agent reads it twice a second. A worker whose count has not moved
for --hang-timeout after its first heartbeat is hung, whether it is deadlocked, stuck
in a collective, or stopped by SIGSTOP. Before it is killed its Python stack is taken
with py-spy (which can read a stopped process), else with faulthandler inside the
worker (which works while it runs, even in C code holding the GIL).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable

from ...core.config.worker_env import HEARTBEAT_FILE, HEARTBEAT_FORMAT, HEARTBEAT_SIZE
from ...core.rendezvous.liveness import StalenessTracker
from ..runtime_dir import write_small_file
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

STACK_FILE = "RTRAIN_STACK_FILE"
# The signal the worker's faulthandler dumps its stack on: a real-time signal that
# Slurm, Lightning and the like do not use (they take SIGUSR1/SIGUSR2).
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
PY_SPY_TIMEOUT_S = 10.0
FAULTHANDLER_WAIT_S = 2.0
MAX_STACK_CHARS = 8000
# The heartbeat files are read at most this often (and a quarter of --hang-timeout), not
# on every 0.1 s monitor pass: a hang is counted in tens of seconds, and an idle agent
# should do as little as it can between passes.
HANG_CHECK_S = 0.5


class HangWatch:
    def __init__(
        self, timeout: float, beat_dir: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._beat_dir = beat_dir
        self._tracker: StalenessTracker[int] = StalenessTracker(
            timeout, armed_by_first_change=True, initial=0
        )
        self._files: dict[int, str] = {}
        self._stacks: dict[int, str] = {}
        self._clock = clock
        self.timeout = timeout
        self._check_every = min(HANG_CHECK_S, timeout / 4)
        self._next_check = float("-inf")

    def worker_env(self, local_rank: int, log_dir: str) -> dict[str, str]:
        """Create the worker's heartbeat file; the variables that point the worker at it.

        Heartbeat files live in beat_dir (memory-backed where /dev/shm exists), not in
        the log dir, which may be a network file system.
        """
        path = os.path.join(self._beat_dir, f"rank{local_rank}.beat")
        write_small_file(path, b"\0" * HEARTBEAT_SIZE, f"local rank {local_rank}'s heartbeat file")
        self._files[local_rank] = path
        self._stacks[local_rank] = os.path.join(log_dir, "stack.txt")
        return {HEARTBEAT_FILE: path, STACK_FILE: self._stacks[local_rank]}

    def stack_file(self, local_rank: int) -> str:
        return self._stacks[local_rank]

    def hung(self, running: list[int]) -> list[int]:
        """Local ranks among `running` whose heartbeat stopped for longer than the timeout
        (found at most HANG_CHECK_S late)."""
        now = self._clock()
        if now < self._next_check:
            return []
        self._next_check = now + self._check_every
        for local_rank in running:
            beat = self.read(local_rank)
            if beat is not None:
                self._tracker.observe(local_rank, beat[0], now)
        return [r for r in self._tracker.stale(now) if r in running]

    def read(self, local_rank: int) -> tuple[int, int] | None:
        """(count, step) of the worker's last heartbeat, or None if the file is unreadable."""
        try:
            with open(self._files[local_rank], "rb") as handle:
                data = handle.read(HEARTBEAT_SIZE)
        except (KeyError, OSError):
            return None
        if len(data) != HEARTBEAT_SIZE:
            return None
        count, step = struct.unpack(HEARTBEAT_FORMAT, data)
        return count, step

    def silent_for(self, local_rank: int) -> float:
        return self._tracker.silent_for(local_rank, self._clock())


def capture_stack(pid: int, stack_file: str) -> str:
    """The worker's Python stack, by py-spy if it works, else by its faulthandler.

    RTRAIN_STACK_TOOL=faulthandler skips py-spy (where ptrace is not allowed it only
    costs time).
    """
    use_py_spy = os.environ.get("RTRAIN_STACK_TOOL", "py-spy") != "faulthandler"
    text = _py_spy(pid) if use_py_spy else None
    if text is None:
        text = _faulthandler(pid, stack_file)
    if text is None:
        return (
            "(no stack: py-spy is not installed or not permitted, and faulthandler did not answer)"
        )
    return text[-MAX_STACK_CHARS:]


def _py_spy(pid: int) -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    tool = beside if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if tool is None:
        return None
    try:
        # --nonblocking reads memory without ptrace-stopping the target: works on a
        # process that is already stopped, and never pauses a live one.
        result = subprocess.run(
            [tool, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("py-spy failed on pid %d: %s", pid, exc)
        return None
    if result.returncode != 0 or "Thread" not in result.stdout:
        logger.warning("py-spy could not read pid %d: %s", pid, result.stderr.strip()[:200])
        return None
    return "py-spy dump:\n" + result.stdout.strip()


def _faulthandler(pid: int, stack_file: str) -> str | None:
    try:
        before = os.path.getsize(stack_file)
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return None

    def dumped() -> bool:
        try:
            return os.path.getsize(stack_file) > before
        except OSError:
            return False

    if not SYSTEM_CLOCK.wait_until(dumped, FAULTHANDLER_WAIT_S, 0.05):
        return None
    time.sleep(0.1)  # let the dump finish
    try:
        with open(stack_file) as handle:
            handle.seek(before)
            return "faulthandler dump:\n" + handle.read().strip()
    except OSError:
        return None
