"""What every test run gets: no process a test started outlives it, and, on request, a
CPU load beside the tests.

- Every process a test starts inherits PYTEST_RTRAIN_PROCESS=<run>:<worker>:<test> (set in
  this process's environment for the test's duration; children copy it, forked workers
  keep their parent's). When a test ends, whatever still carries its tag is killed
  (SIGCONT, then SIGKILL: a stopped process too), so a test that timed out or failed
  half-way leaves no agent behind. After the last test, any process of this run still
  alive fails the run. <worker> is pytest-xdist's worker (`-n 2`), or `main`.
- RTRAIN_TEST_LOAD=N (or `auto`: 2 x the CPUs) starts N busy processes for the whole
  run, so that the tests of recovery meet the loaded machine they will meet in CI and
  on shared nodes: `RTRAIN_TEST_LOAD=auto python3 -m pytest tests/integration`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator

import psutil
import pytest

MARK = "PYTEST_RTRAIN_PROCESS"
LOAD = "RTRAIN_TEST_LOAD"
# The run's name, set again in pytest_configure under pytest-xdist (-n 2): there the
# controller hands its name to its workers, so that its last check sees what any worker
# left, and each worker tags and checks only its own tests' processes (a worker that
# finishes first must not kill the other's running test). Never taken from the
# environment: a pytest that a test starts (tests/unit/test_test_harness.py) is a run
# of its own, and must not end its parent run's processes.
RUN = uuid.uuid4().hex[:12]
WORKER = f"{RUN}:main"
BETWEEN = f"{WORKER}:between-tests"  # what fixtures of a module or session start with

_load: list[subprocess.Popen[bytes]] = []
_left_behind: list[str] = []  # "test: pid command" for each process a test left


def _tagged(match: Callable[[str], bool]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            tag = proc.environ().get(MARK)
            if tag is not None and match(tag) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue  # gone, or not ours to read
    return found


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{proc.pid} {' '.join(proc.cmdline())[:120]}"
    return str(proc.pid)


def _end(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


@contextlib.contextmanager
def outliving_the_test() -> Iterator[None]:
    """Processes started inside are a fixture's, not the test's (an etcd member a test
    restarts belongs to the module's cluster): its teardown leaves them alone."""
    tag = os.environ.get(MARK)
    os.environ[MARK] = BETWEEN
    try:
        yield
    finally:
        if tag is not None:
            os.environ[MARK] = tag


def load_count(value: str) -> int:
    """RTRAIN_TEST_LOAD's busy processes: a count, or `auto` for 2 x the CPUs."""
    if value.strip() == "auto":
        return 2 * (os.cpu_count() or 1)
    try:
        count = int(value)
    except ValueError:
        raise pytest.UsageError(f"{LOAD}={value!r}: a count of busy processes, or auto") from None
    if count < 0:
        raise pytest.UsageError(f"{LOAD}={value!r}: a count of busy processes, or auto")
    return count


def _name_the_run(config: pytest.Config) -> bool:
    """RUN, WORKER and BETWEEN for this process; True in an xdist worker."""
    global RUN, WORKER, BETWEEN
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        RUN = str(workerinput["testrunuid"])
        WORKER = f"{RUN}:{workerinput['workerid']}"
    elif getattr(config.option, "testrunuid", "") is None:  # an xdist controller
        config.option.testrunuid = RUN  # its workers' workerinput["testrunuid"]
    BETWEEN = f"{WORKER}:between-tests"
    return workerinput is not None


def pytest_configure(config: pytest.Config) -> None:
    in_a_worker = _name_the_run(config)
    os.environ[MARK] = BETWEEN
    count = load_count(os.environ.get(LOAD, "0") or "0")
    if in_a_worker:
        count = 0  # the controller runs the load for the whole run
    env = {k: v for k, v in os.environ.items() if k != MARK}  # not a test's process
    for _ in range(count):
        _load.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env))
    if count:
        print(f"{LOAD}: {count} busy processes beside the tests", file=sys.stderr)


def pytest_unconfigure(config: pytest.Config) -> None:
    for proc in _load:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    tag = f"{WORKER}:{zlib.crc32(request.node.nodeid.encode()):08x}"
    os.environ[MARK] = tag
    try:
        yield
    finally:
        os.environ[MARK] = BETWEEN
        left = _tagged(lambda value: value == tag)
        if left:
            _left_behind.extend(f"{request.node.nodeid}: {_describe(p)}" for p in left)
            _end(left)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # The controller of an xdist run checks the whole run, after its workers ended.
    mine = f"{WORKER}:" if hasattr(session.config, "workerinput") else f"{RUN}:"
    alive = _tagged(lambda value: value.startswith(mine))
    if alive:
        lines = [_describe(p) for p in alive]
        _end(alive)
        print(
            f"\n{len(lines)} processes started by this test run were still alive after "
            "it; killed:\n  " + "\n  ".join(lines),
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _left_behind:
        terminalreporter.write_line(
            f"{len(_left_behind)} processes outlived their test and were killed in its teardown:"
        )
        for line in _left_behind:
            terminalreporter.write_line(f"  {line}")
