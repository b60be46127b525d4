"""The repair watcher's "stuck" (core/worker/repair/repairable.py): asked to park, it
releases the group; a training thread that then stays in the function, the process
idle, is reported stuck (the agent restarts it at once instead of after ACK_S); one that
computes, or leaves the function, is not."""

from __future__ import annotations

import importlib
import threading
import time

import pytest

from rtrain.core.contract.repair_files import STUCK, WorkerState, decode_state, encode_state
from rtrain.core.worker.repair.asked import ASKED

# the module (the package's name `repairable` is the decorator)
repairable = importlib.import_module("rtrain.core.worker.repair.repairable")
STUCK_AFTER_S = 0.2


@pytest.fixture(autouse=True)
def _process_not_asked():
    """A watcher asked to park sets the process-wide ASKED (which ends a snapshot's wait
    for its replication); left set, every later test of this process that snapshots
    found "a repair came while the snapshot ... replicated" (two of them under -n 2)."""
    yield
    ASKED.clear()


class Control:
    """The worker's control folder: a request is there at once; what it says is kept."""

    def __init__(self) -> None:
        self.said: list[tuple[str, int]] = []

    def requested(self, generation: int) -> bool:
        return True

    def say(self, state: str, generation: int) -> None:
        self.said.append((state, generation))


class Group:
    def __init__(self) -> None:
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


def _watching() -> tuple[Control, repairable._Watcher]:
    control, group = Control(), Group()
    watcher = repairable._Watcher(control, 3, group, stuck_after_s=STUCK_AFTER_S)  # type: ignore[arg-type]
    assert group.released.wait(5)
    return control, watcher


def test_a_training_thread_idle_after_the_release_is_reported_stuck() -> None:
    control, watcher = _watching()
    deadline = time.monotonic() + 5
    while not control.said and time.monotonic() < deadline:
        time.sleep(0.01)  # blocked, as in gloo's queued send: the process idle
    watcher.stop()
    assert control.said == [(STUCK, 3)]


def test_a_training_thread_that_computes_after_the_release_is_not() -> None:
    control, watcher = _watching()
    end = time.monotonic() + STUCK_AFTER_S + repairable.IDLE_WINDOW_S + 0.3
    while time.monotonic() < end:
        pass  # a long step's compute: the process busy
    watcher.stop()
    assert control.said == []


def test_a_training_thread_that_leaves_the_function_is_not() -> None:
    control, watcher = _watching()
    watcher.left.set()  # its collective failed at once and it went on to park
    time.sleep(STUCK_AFTER_S + repairable.IDLE_WINDOW_S + 0.2)
    watcher.stop()
    assert control.said == []


def test_stuck_is_a_state_on_the_wire() -> None:
    state = WorkerState(STUCK, 4, 1234)
    assert decode_state(encode_state(state)) == state
