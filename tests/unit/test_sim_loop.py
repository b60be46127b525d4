"""scripts/sim_loop.py: the simulator's loop runs every task when due and again when it
asks, and RunSlots lets only so many joins run at once (a sleep gives the slot up)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from sim_loop import Loop, RunSlots


def test_the_loop_runs_tasks_in_due_order_and_again_when_asked() -> None:
    loop = Loop(workers=1)
    seen: list[str] = []
    done, late = threading.Event(), threading.Event()

    def repeating() -> float | None:
        seen.append("r")
        if seen.count("r") == 3:
            done.set()
            return None
        return 0.01

    def once() -> None:
        seen.append("late")
        late.set()

    loop.call_later(0.5, once)
    loop.call_later(0.0, repeating)
    assert done.wait(5) and late.wait(5)
    loop.stop()
    assert seen[0] == "r" and seen.count("r") == 3 and seen.count("late") == 1
    figures = loop.lateness.take()
    assert figures["n"] >= 3 and figures["max_ms"] >= 0
    assert loop.lateness.take() == {"n": 0}  # taken: starts over


def test_run_slots_bound_the_joins_running_at_once() -> None:
    slots = RunSlots(2)
    running, peak = 0, 0
    lock = threading.Lock()
    gate = threading.Event()

    def join() -> None:
        nonlocal running, peak
        with slots:
            with lock:
                running += 1
                peak = max(peak, running)
            gate.wait(5)
            with lock:
                running -= 1
            slots.clock.sleep(0.001)  # gives the slot up while asleep, takes it back

    threads = [threading.Thread(target=join) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while peak < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for thread in threads:
        thread.join(5)
    assert peak == 2
    assert slots.waited.take()["n"] >= 6
