"""Hang detection: workers' heartbeat files, and the stack of a worker that stopped.

Each worker gets a small file that rtrain.core.heartbeat() bumps through a shared
mapping; the agent reads it twice a second, through a descriptor it opened when it made
the file: a runtime folder removed under a running job (a neighbour's sweep, an admin's
rm) takes the name, not the file, so the agent still sees every heartbeat. (Read by its
name, a worker whose first heartbeat the agent had not read yet when the folder went
was never armed: never hung, the job stalled for good.) A worker whose count has not
moved for --hang-timeout after its first heartbeat is hung, whether it is deadlocked,
stuck in a collective, or stopped by SIGSTOP. A worker whose process is held (state T:
SIGSTOP, a debugger; or D: uninterruptible sleep) for the whole --hang-timeout is hung
too, whatever its heartbeat (a thread of its own may bump it) says; a slow step in a
process that runs is not, until the timeout. Before it is killed its Python stack is
taken with py-spy (which can read a stopped process), else with faulthandler inside the
worker (which works while it runs, even in C code holding the GIL, but not while it is
held: then it is not asked).

Which rank is the culprit (inspect_hang): a held process is; a rank found waiting in a
collective, or exiting after a collective error, is a victim of another rank; the
failure's time is when the worker went silent or was first seen held (the oldest last
heartbeat goes first among the culprits, core/rendezvous/failures.root_cause_first).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from ...core.clock import Clock
from ...core.contract.environment import (
    HEARTBEAT_FILE,
    HEARTBEAT_FORMAT,
    HEARTBEAT_SIZE,
    STACK_FILE,
)
from ...core.rendezvous.failures import RecordError, is_collective_error, parse_error_file
from ...core.rendezvous.liveness import StalenessTracker
from ..runtime_dir import write_small_file
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

# The signal the worker's faulthandler dumps its stack on: a real-time signal that
# Slurm, Lightning and the like do not use (they take SIGUSR1/SIGUSR2).
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
PY_SPY_TIMEOUT_S = 10.0
FAULTHANDLER_WAIT_S = 2.0
MAX_STACK_CHARS = 8000
# How long a hung worker found writing its error file on its way out is given to finish it.
EXIT_WAIT_S = 1.0
# The heartbeat files are read at most this often (and a quarter of --hang-timeout), not
# on every 0.1 s monitor pass: a hang is counted in tens of seconds, and an idle agent
# should do as little as it can between passes.
HANG_CHECK_S = 0.5
# A process in one of these states cannot run its step: stopped (SIGSTOP, a debugger's
# stop) or in uninterruptible sleep (a hung file system or driver call). Signals stay
# pending on it: only SIGKILL ends a stopped process at once.
STOPPED_STATES = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
HELD_STATES = STOPPED_STATES | {psutil.STATUS_DISK_SLEEP}


class HangWatch:
    def __init__(
        self,
        timeout: float,
        beat_dir: str,
        clock: Clock = SYSTEM_CLOCK,
        first_beat_timeout: float | None = None,
    ) -> None:
        """clock: the checks' times, silences and holds (now), a finding's fault time
        (wall); first_beat_timeout: a worker without a heartbeat this long after the
        first check that saw it running (the group's start, not its spawn's wait) is
        hung too; None: a worker is hung only after its first heartbeat."""
        self._beat_dir = beat_dir
        self.first_beat_timeout = first_beat_timeout
        self._started: dict[int, float] = {}  # local rank -> first checked running
        self._tracker: StalenessTracker[int] = StalenessTracker(
            timeout, armed_by_first_change=True, initial=0
        )
        # local rank -> a descriptor of its heartbeat file, opened when it was made: read
        # by it, not by name, the file outlives its folder (closed with the watch)
        self._beats: dict[int, int] = {}
        self._closer = weakref.finalize(self, _close_all, self._beats)
        self._stacks: dict[int, str] = {}
        self.clock = clock
        self.timeout = timeout
        self._check_every = min(HANG_CHECK_S, timeout / 4)
        self._next_check = float("-inf")
        self._held_since: dict[int, float] = {}  # local rank -> first seen held (T or D)

    def worker_env(self, local_rank: int, log_dir: str) -> dict[str, str]:
        """Create the worker's heartbeat file; the variables that point the worker at it.

        Heartbeat files live in beat_dir (memory-backed where /dev/shm exists), not in
        the log dir, which may be a network file system.
        """
        path = os.path.join(self._beat_dir, f"rank{local_rank}.beat")
        write_small_file(path, b"\0" * HEARTBEAT_SIZE, f"local rank {local_rank}'s heartbeat file")
        old = self._beats.pop(local_rank, None)
        if old is not None:
            os.close(old)
        self._beats[local_rank] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._started.pop(local_rank, None)  # a new worker: its start is its first check
        self._stacks[local_rank] = os.path.join(log_dir, "stack.txt")
        return {HEARTBEAT_FILE: path, STACK_FILE: self._stacks[local_rank]}

    def stack_file(self, local_rank: int) -> str:
        return self._stacks[local_rank]

    def hung(self, running: Mapping[int, int] | Sequence[int]) -> list[int]:
        """Local ranks among `running` whose heartbeat stopped for longer than the timeout,
        or (given local rank -> pid) whose process was held in state T or D for the whole
        timeout (found at most HANG_CHECK_S late)."""
        now = self.clock.now()
        if now < self._next_check:
            return []
        self._next_check = now + self._check_every
        pids = running if isinstance(running, Mapping) else {}
        unbeaten = []  # read once here, for the first-heartbeat deadline too
        for local_rank in running:
            self._started.setdefault(local_rank, now)
            beat = self.read(local_rank)
            if beat is not None:
                self._tracker.observe(local_rank, beat[0], now)
                if beat[0] == 0:
                    unbeaten.append(local_rank)
            if local_rank in pids:
                self._observe_state(local_rank, process_state(pids[local_rank]), now)
        stale = set(self._tracker.stale(now)) | set(self._late_first_beat(unbeaten, now))
        return [r for r in running if r in stale or self.held_for(r) >= self.timeout]

    def _late_first_beat(self, unbeaten: Iterable[int], now: float) -> list[int]:
        """Of the ranks without a heartbeat yet, those past first_beat_timeout."""
        if self.first_beat_timeout is None:
            return []
        limit = self.first_beat_timeout
        return [r for r in unbeaten if now - self._started.get(r, now) > limit]

    def never_beat(self, local_rank: int) -> bool:
        """Whether the worker's file says it has not called heartbeat() yet."""
        beat = self.read(local_rank)
        return beat is not None and beat[0] == 0

    def _observe_state(self, local_rank: int, state: str | None, now: float) -> None:
        if state in HELD_STATES:
            self._held_since.setdefault(local_rank, now)
        else:
            self._held_since.pop(local_rank, None)

    def held_for(self, local_rank: int) -> float:
        """Seconds the worker's process has been seen held (T or D) without a break; 0 if
        it was not at the last check."""
        since = self._held_since.get(local_rank)
        return 0.0 if since is None else self.clock.now() - since

    def still_held(self, local_rank: int, state: str | None) -> bool:
        """Whether a process in `state` now is held for good: stopped, or in D now and at
        the last check too (a moment in D is an ordinary disk read)."""
        return state in STOPPED_STATES or (state in HELD_STATES and local_rank in self._held_since)

    def read(self, local_rank: int) -> tuple[int, int] | None:
        """(count, step) of the worker's last heartbeat, or None if it has no file here
        (or it cannot be read). Its name may be gone: the file is read by descriptor."""
        try:
            data = os.pread(self._beats[local_rank], HEARTBEAT_SIZE, 0)
        except (KeyError, OSError):
            return None
        if len(data) != HEARTBEAT_SIZE:
            return None
        count, step = struct.unpack(HEARTBEAT_FORMAT, data)
        return count, step

    def silent_for(self, local_rank: int) -> float:
        """Seconds since its last heartbeat; since its start, where it made none."""
        now = self.clock.now()
        if local_rank in self._started and self.never_beat(local_rank):
            return now - self._started[local_rank]
        return self._tracker.silent_for(local_rank, now)

    @property
    def beat_dir(self) -> str:
        return self._beat_dir

    def close(self) -> None:
        """Close the heartbeat files (the generation is over); read() says None after."""
        self._closer()


def _close_all(descriptors: dict[int, int]) -> None:
    """Close a watch's heartbeat descriptors (at close(), or when it is collected)."""
    while descriptors:
        _, fd = descriptors.popitem()
        os.close(fd)


def process_state(pid: int) -> str | None:
    """The process's state, as psutil names it; None if it is gone."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


@dataclass(frozen=True)
class HangFinding:
    """A hung worker looked at before it is killed: what its failure record says, and
    whether it is the likely culprit or a victim of another rank."""

    message: str
    stack: str
    fault_time: float  # wall clock: when it went silent, or was first seen held
    held: bool  # its process was stopped or in uninterruptible sleep: a culprit
    victim: bool  # waiting in a collective, or exiting after a collective error


def inspect_hang(
    hangs: HangWatch, local_rank: int, pid: int, error_file: str, ending: bool = False
) -> HangFinding:
    """Why the worker is hung, its stack, and its part. ending: found as the generation
    ended (the job moved on before this node's own hang check fired)."""
    state = process_state(pid)
    held = hangs.still_held(local_rank, state)
    error = None if held else _error_text(error_file)
    # A worker past its error (or held) may not answer faulthandler: py-spy only.
    stack = capture_stack(pid, hangs.stack_file(local_rank), held=held or error is not None)
    if not held and error is None:
        if _exiting(stack):
            # On its way out, its error being written (a peer's failure broke its
            # collective as its hang check fired): what it failed of says whether it is
            # a victim. (The OS's time: a real process's progress, not the watch's clock.)
            SYSTEM_CLOCK.wait_until(lambda: _error_text(error_file) is not None, EXIT_WAIT_S, 0.02)
        # read again in any case: taking the stack takes time (py-spy under load), and
        # the worker may have written its error and gone on to its exit meanwhile
        error = _error_text(error_file)
    if held:
        victim = False
        what = " (process stopped)" if state in STOPPED_STATES else " (process in state D)"
    elif error is not None:
        victim = is_collective_error(error)
        first = error.splitlines()[0][:300] if error else ""
        what = (
            f" (exiting after a collective error, likely a victim of another rank: {first})"
            if victim
            else f" (exiting after its error: {first})"
        )
    else:
        victim = "torch/distributed/" in stack
        what = " (waiting in a collective: likely a victim of another rank)" if victim else ""
    silent, held_for = hangs.silent_for(local_rank), hangs.held_for(local_rank)
    beat = hangs.read(local_rank)
    step = f" after step {beat[1]}" if beat is not None and beat[0] > 0 else ""
    held_text = f", held for {held_for:.1f}s" if held and held_for > 0 else ""
    when = ", found as the generation ended" if ending else ""
    if hangs.first_beat_timeout is not None and beat is not None and beat[0] == 0 and not held:
        message = (
            f"hung: no first heartbeat in the {silent:.1f}s since it started{what}{when} "
            f"(--first-heartbeat-timeout={hangs.first_beat_timeout:g}s)"
        )
    else:
        message = (
            f"hung: no heartbeat for {silent:.1f}s{step}{what}{held_text}{when} "
            f"(--hang-timeout={hangs.timeout:g}s)"
        )
    return HangFinding(message, stack, hangs.clock.wall() - max(silent, held_for), held, victim)


def _exiting(stack: str) -> bool:
    """The stack is the worker writing its error file or past it, in its exit
    (agent/workers/boot.py's _write_error_file and _finish), after an exception."""
    return any(
        "boot.py" in ln and ("_write_error_file" in ln or "_finish" in ln)
        for ln in stack.splitlines()
    )


def _error_text(error_file: str) -> str | None:
    """The error the worker wrote before it hung on its way out (its message, then its
    traceback), or None if it wrote none."""
    try:
        with open(error_file) as handle:
            content = parse_error_file(handle.read())
    except (OSError, RecordError):
        return None
    return f"{content.message}\n{content.traceback[-2000:]}"


def capture_stack(pid: int, stack_file: str, held: bool = False) -> str:
    """The worker's Python stack, by py-spy if it works, else by its faulthandler (not
    asked when held: a held process, or one past its error, would not answer).

    RTRAIN_STACK_TOOL=faulthandler skips py-spy (where ptrace is not allowed it only
    costs time).
    """
    use_py_spy = os.environ.get("RTRAIN_STACK_TOOL", "py-spy") != "faulthandler"
    text = _py_spy(pid) if use_py_spy else None
    if text is None and not held:
        text = _faulthandler(pid, stack_file)
    if text is None:
        if held:
            return "(no stack: py-spy could not read it, and it would not answer faulthandler)"
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

    # The OS's time, not a watch's clock: a real process answering a signal.
    if not SYSTEM_CLOCK.wait_until(dumped, FAULTHANDLER_WAIT_S, 0.05):
        return None
    SYSTEM_CLOCK.sleep(0.1)  # let the dump finish
    try:
        with open(stack_file) as handle:
            handle.seek(before)
            return "faulthandler dump:\n" + handle.read().strip()
    except OSError:
        return None
