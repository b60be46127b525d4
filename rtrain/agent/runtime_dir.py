"""The agent's folders: the run's log folder, and its per-run folder in shared memory
(sweeping the ones dead agents left).

An agent that is SIGKILLed (or whose node is OOM-killed) cannot remove its folder, and
on /dev/shm that folder holds every snapshot slot and replica: gigabytes of memory that
nothing would ever free. So a new agent removes the folders of agents that are gone.

"Gone" is proven by a lock, not a pid: each agent holds an flock on <folder>/owner.lock
for its lifetime (its workers inherit it, so orphaned workers keep it too). A pid says
nothing across PID namespaces: two containers sharing /dev/shm (docker --ipc=host) see
different processes under the same numbers, and a pid check there frees a live job's
snapshots. The kernel drops the lock when the last holder dies, whichever namespace it
was in. A folder is created under a hidden name and renamed once locked, so no sweeper
ever sees it unlocked. Folders without a lock file come from older rtrain versions and
are judged by their pid, as those versions did.

The base folder is /dev/shm (else the temp folder), or $RTRAIN_RUNTIME_DIR.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass

import psutil

from ..core.config.launch_spec import LaunchSpec
from ..core.errors import RtrainError, UsageError
from ..core.rendezvous.failures import FailureRecord

logger = logging.getLogger(__name__)

# Distinct from the log folders ("rtrain_<random>") that may share /tmp with these.
PREFIX = "rtrain-run-"
OWNED = re.compile(PREFIX + r"(\d+)-[^/]+$")
LOCK = "owner.lock"
BASE_ENV = "RTRAIN_RUNTIME_DIR"


def make_run_log_dir(spec: LaunchSpec) -> str:
    """<--log-dir>/<run id>_<random>: a new folder for this run's logs."""
    try:
        base = spec.log_dir or tempfile.mkdtemp(prefix="rtrain_")
        os.makedirs(base, exist_ok=True)
        return tempfile.mkdtemp(prefix=f"{spec.rdzv.run_id}_", dir=base)
    except OSError as exc:
        where = spec.log_dir or tempfile.gettempdir()
        raise UsageError(
            f"--log-dir {where}: cannot make the run's log folder ({exc.strerror})"
        ) from None


FAILURE_REPORT = "failures.json"


def write_failure_report(run_log_dir: str, failures: list[FailureRecord]) -> None:
    """<run_log_dir>/failures.json: the report's records, root cause first, for tools."""
    path = os.path.join(run_log_dir, FAILURE_REPORT)
    try:
        with open(path, "w") as handle:
            handle.write("[\n" + ",\n".join(r.encode() for r in failures) + "\n]\n")
    except OSError as exc:  # the report on the console still has everything
        logger.warning("could not write %s (%s)", path, exc.strerror)


class NoSpaceError(RtrainError):
    """A write under the runtime folder found its file system full."""


def no_space(folder: str, needed: int, what: str, exc: OSError) -> NoSpaceError | None:
    """The clear error for `exc` if it says the file system is full, else None."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    try:
        stats = os.statvfs(folder)
        free = f"{_size(stats.f_bavail * stats.f_frsize)} free"
    except OSError:
        free = "free space unknown"
    return NoSpaceError(
        f"no space left in {folder} for {what}: {_size(needed)} needed, {free} "
        "(free shared memory, lower --snapshot-memory, or point RTRAIN_RUNTIME_DIR elsewhere)"
    )


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def write_small_file(path: str, data: bytes, what: str) -> None:
    """Write a small file under the runtime folder; a full file system is a NoSpaceError.
    A page is the least a file takes on tmpfs, so that is the space it needs."""
    try:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
    except OSError as exc:
        error = no_space(
            os.path.dirname(path), max(len(data), os.sysconf("SC_PAGE_SIZE")), what, exc
        )
        if error is None:
            raise
        raise error from None


def make_folder(path: str, what: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        error = no_space(os.path.dirname(path), os.sysconf("SC_PAGE_SIZE"), what, exc)
        if error is None:
            raise
        raise error from None


@dataclass
class RuntimeDir:
    """This agent's folder and the lock that says it is alive; close() releases both."""

    path: str
    lock_fd: int

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)


def runtime_base(environ: dict[str, str] | None = None) -> str:
    given = (environ if environ is not None else os.environ).get(BASE_ENV)
    if given:
        return given
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def make_runtime_dir(base: str | None = None) -> RuntimeDir:
    """A new folder for this agent, memory-backed where /dev/shm exists, locked."""
    base = base or runtime_base()
    sweep_dead(base)
    try:
        hidden = tempfile.mkdtemp(prefix=f".{PREFIX}new-", dir=base)
        fd = os.open(os.path.join(hidden, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = os.path.join(base, f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        os.rename(hidden, path)
    except OSError as exc:
        raise RtrainError(f"cannot make this agent's folder in {base}: {exc.strerror}") from None
    return RuntimeDir(path, fd)


def sweep_dead(base: str) -> list[str]:
    """Remove this user's agent folders whose agent is gone; the paths removed."""
    removed = []
    for path in glob.glob(os.path.join(base, PREFIX + "*")):
        match = OWNED.search(path)
        if match is None or not _ours(path):
            continue
        if _remove_if_unowned(path, int(match[1])):
            removed.append(path)
    if removed:
        logger.info("freed %d folder(s) left by agents that died: %s", len(removed), removed)
    return removed


def _remove_if_unowned(path: str, pid: int) -> bool:
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR)
    except FileNotFoundError:  # an older rtrain's folder: its pid is all there is
        if psutil.pid_exists(pid):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # its owner (or an orphaned worker of it) is alive
            raise
        shutil.rmtree(path, ignore_errors=True)  # holding the lock: no one else can
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _ours(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.getuid()
    except OSError:
        return False
