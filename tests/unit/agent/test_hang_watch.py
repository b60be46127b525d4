"""HangWatch and inspect_hang on real processes (a stopped one, a running one, one that
wrote a collective error and hangs on its way out), on a fake clock."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rtrain.agent.workers.hang_watch import HangWatch, inspect_hang, process_state
from rtrain.core.clock import wait_until
from rtrain.core.contract.environment import HEARTBEAT_FILE
from rtrain.core.rendezvous.failures import error_file_payload

from .fakes import FAKE_EPOCH, FakeClock

TIMEOUT = 2.0


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that runs (sleeping) and never heartbeats, as a slow first step does.
    Yielded once it sleeps: an interpreter still starting reads its files in state D,
    and seen in D at two checks 10 fake seconds apart it is held (a flake under load)."""
    code = "import time; print('ready', flush=True); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _watch(tmp_path: Path, clock: FakeClock) -> HangWatch:
    watch = HangWatch(TIMEOUT, str(tmp_path), clock=clock.clock)
    watch.worker_env(0, str(tmp_path))
    return watch


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    stopped = {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}
    assert wait_until(lambda: process_state(pid) in stopped, 10, 0.01, time.monotonic, time.sleep)


def _ran_again(pid: int) -> bool:
    running = {psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING}
    return wait_until(lambda: process_state(pid) in running, 10, 0.01, time.monotonic, time.sleep)


def test_a_process_stopped_for_the_whole_timeout_is_hung_without_a_heartbeat(tmp_path, sleeper):
    clock = FakeClock(0.0)
    watch = _watch(tmp_path, clock)
    running = {0: sleeper.pid}
    assert watch.hung(running) == []
    clock.time = 10.0  # a slow step in a process that runs: never armed, not hung
    assert watch.hung(running) == []
    _stop(sleeper.pid)
    clock.time = 11.0
    assert watch.hung(running) == []  # held for less than the timeout
    clock.time = 11.0 + TIMEOUT
    assert watch.hung(running) == [0]
    found = inspect_hang(watch, 0, sleeper.pid, str(tmp_path / "error.json"))
    assert found.held and not found.victim
    assert "(process stopped), held for 2.0s" in found.message, found.message
    assert found.fault_time == FAKE_EPOCH + 0.0  # the wall clock's: silent since its start


def test_a_process_that_runs_again_is_not_held(tmp_path, sleeper):
    clock = FakeClock(0.0)
    watch = _watch(tmp_path, clock)
    running = {0: sleeper.pid}
    _stop(sleeper.pid)
    watch.hung(running)
    os.kill(sleeper.pid, signal.SIGCONT)
    assert _ran_again(sleeper.pid)
    clock.time = 1.0
    watch.hung(running)
    clock.time = 1.0 + TIMEOUT
    assert watch.hung(running) == []
    assert watch.held_for(0) == 0.0


def test_a_rank_exiting_after_a_collective_error_is_a_victim(tmp_path, sleeper):
    error_file = tmp_path / "error.json"
    error = "DistBackendError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    error_file.write_text(error_file_payload(error, "Traceback ...\n", 0.0))
    clock = FakeClock(0.0)
    found = inspect_hang(_watch(tmp_path, clock), 0, sleeper.pid, str(error_file))
    assert found.victim and not found.held
    assert (
        "exiting after a collective error" in found.message and "Connection closed" in found.message
    )
    # an error of its own is not a victim's
    error_file.write_text(error_file_payload("ValueError: bad batch", "", 0.0))
    found = inspect_hang(_watch(tmp_path, clock), 0, sleeper.pid, str(error_file))
    assert not found.victim and "exiting after its error: ValueError" in found.message


def test_a_worker_is_watched_after_its_heartbeat_folder_is_removed(tmp_path, monkeypatch):
    """The runtime folder removed under a running job (as a neighbour's sweep did): a
    worker that beat before it went, the agent not having read that yet, is still
    watched, and hung once it stops. Read by name, it was never armed, never hung."""
    from rtrain.core.worker.api import heartbeat

    folder = tmp_path / "gen0"
    folder.mkdir()
    clock = FakeClock(0.0)
    watch = HangWatch(TIMEOUT, str(folder), clock=clock.clock)
    env = watch.worker_env(0, str(tmp_path))
    assert watch.hung([0]) == []  # read before the worker's first heartbeat
    monkeypatch.setenv(HEARTBEAT_FILE, env[HEARTBEAT_FILE])
    for step in range(6):
        heartbeat(step)  # the worker's own call: its mapping of the file
    shutil.rmtree(folder)
    clock.time = 1.0
    assert watch.read(0) == (6, 5)
    assert watch.hung([0]) == []  # it beat a second ago
    clock.time = 1.1 + TIMEOUT
    assert watch.hung([0]) == [0]


def test_a_worker_without_its_first_heartbeat_is_hung_only_under_the_first_beat_deadline(
    tmp_path, sleeper, monkeypatch
):
    """--first-heartbeat-timeout: a worker that never beat (a hang in init_process_group
    or its restore) is hung that long after it started, named so; one that beat once is
    left to --hang-timeout; without the flag a worker that never beats is never hung."""
    from rtrain.core.worker.api import heartbeat

    clock = FakeClock(100.0)
    watch = HangWatch(TIMEOUT, str(tmp_path), clock=clock.clock, first_beat_timeout=5.0)
    watch.worker_env(0, str(tmp_path / "w0"))
    env = watch.worker_env(1, str(tmp_path / "w1"))
    running = {0: sleeper.pid, 1: sleeper.pid}
    assert watch.hung(running) == []
    clock.time = 104.0
    monkeypatch.setenv(HEARTBEAT_FILE, env[HEARTBEAT_FILE])
    heartbeat(0)  # rank 1's first heartbeat, 4 s after its start
    assert watch.hung(running) == []
    clock.time = 105.5  # 5.5 s since the start: rank 0 is late; rank 1 beat 1.5 s ago
    assert watch.hung(running) == [0]
    assert watch.silent_for(0) == 5.5
    found = inspect_hang(watch, 0, sleeper.pid, str(tmp_path / "error.json"))
    assert not found.held
    assert found.message.startswith("hung: no first heartbeat in the 5.5s since it started")
    assert found.fault_time == FAKE_EPOCH + 100.0  # its start, on the watch's wall clock
    assert "(--first-heartbeat-timeout=5s)" in found.message
    clock.time = 104.0 + TIMEOUT + 0.5  # rank 1 is hung only by --hang-timeout since its beat
    assert watch.hung(running) == [0, 1]
    assert (
        "no heartbeat for 2.5s after step 0"
        in inspect_hang(watch, 1, sleeper.pid, str(tmp_path / "error.json")).message
    )

    (tmp_path / "plain").mkdir()
    plain = HangWatch(TIMEOUT, str(tmp_path / "plain"), clock=clock.clock)
    plain.worker_env(0, str(tmp_path / "p0"))
    clock.time += 3600.0
    assert plain.hung({0: sleeper.pid}) == []  # never beat, no deadline: never hung


def test_closing_a_watch_closes_its_heartbeat_files(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    watch = HangWatch(TIMEOUT, str(tmp_path))
    for local_rank in range(4):
        watch.worker_env(local_rank, str(tmp_path))
    assert len(os.listdir("/proc/self/fd")) == before + 4
    watch.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert watch.read(0) is None
    watch.close()  # twice is harmless


EXITING = """
import faulthandler, os, signal, sys, time

stack_file, error_file, payload, sig = sys.argv[1:]
faulthandler.register(int(sig), file=open(stack_file, "a"), all_threads=True)


def _write_error_file():  # boot.py's, slow: formatting a traceback under load
    print("ready", flush=True)
    time.sleep(0.3)
    with open(error_file, "w") as handle:
        handle.write(payload)
    time.sleep(120)


_write_error_file()
"""


def test_a_rank_found_writing_its_collective_error_is_a_victim(tmp_path, monkeypatch):
    """Hung as a peer's failure broke its collective: its error is waited for, briefly."""
    from rtrain.agent.workers.hang_watch import STACK_SIGNAL

    monkeypatch.setenv("RTRAIN_STACK_TOOL", "faulthandler")
    (tmp_path / "boot.py").write_text(EXITING)
    error_file = tmp_path / "error.json"
    error = "RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"
    payload = error_file_payload(error, "", 0.0)
    clock = FakeClock(0.0)
    watch = _watch(tmp_path, clock)
    args = [watch.stack_file(0), str(error_file), payload, str(int(STACK_SIGNAL))]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "boot.py"), *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        found = inspect_hang(watch, 0, proc.pid, str(error_file))
    finally:
        proc.kill()
        proc.wait()
    assert found.victim and not found.held, found.message
    assert "exiting after a collective error" in found.message


WRITTEN_DURING_THE_STACK = """
import faulthandler, signal, sys, time

stack_file, error_file, payload, sig = sys.argv[1:]
open(stack_file, "a").close()  # made at start, as a worker's faulthandler file is


def written(signum, frame):  # its error lands while the agent takes its stack
    with open(error_file, "w") as handle:
        handle.write(payload)
    with open(stack_file, "a") as handle:
        faulthandler.dump_traceback(handle, all_threads=True)


signal.signal(int(sig), written)


def _finish():  # boot.py's: the interpreter's exit, after the error file
    print("ready", flush=True)
    while True:
        time.sleep(0.05)


_finish()
"""


def test_a_rank_whose_error_is_written_while_its_stack_is_taken_is_a_victim(tmp_path, monkeypatch):
    """The error file was not there when the check began and is there once the stack
    is taken (py-spy under load takes a while), the worker already in its exit: a
    victim (test_hang_charge under RTRAIN_TEST_LOAD charged node 0's healthy rank)."""
    from rtrain.agent.workers.hang_watch import STACK_SIGNAL

    monkeypatch.setenv("RTRAIN_STACK_TOOL", "faulthandler")
    (tmp_path / "boot.py").write_text(WRITTEN_DURING_THE_STACK)
    error_file = tmp_path / "error.json"
    error = "RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"
    watch = _watch(tmp_path, FakeClock(0.0))
    args = [watch.stack_file(0), str(error_file), error_file_payload(error, "", 0.0)]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "boot.py"), *args, str(int(STACK_SIGNAL))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert not error_file.exists()
        found = inspect_hang(watch, 0, proc.pid, str(error_file))
    finally:
        proc.kill()
        proc.wait()
    assert "_finish" in found.stack
    assert found.victim and not found.held, found.message
