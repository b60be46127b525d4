"""The simulator's own scheduling, for bench_scale.py sim: many simulated agents in one
process without a thread of their own each doing their checks.

Loop: one timer heap served by a few worker threads. A simulated agent's running
generation (its store checks every monitor.STORE_CHECK_S, its lease renewal every
heartbeat interval) is a task on it, so 512 agents in a process are 512 entries in a
heap, not 1,024 runnable threads. Each task's lateness (when it ran, less when it was
due) is recorded: that is how much the simulator itself delayed a check or a renewal.

RunSlots: Rounds.join is a blocking API (its waits are Clock.wait_until), so each
agent joins on a thread of its own, parked on an event the rest of the time; the
clock it joins with gives up the agent's run slot while it sleeps, so that at most a
few joins run Python code at once and the others wait their turn in order, instead of
thousands of threads contending for the interpreter lock. The time a join waited for
a slot is recorded too.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rtrain.core.clock import Clock

Task = Callable[[], "float | None"]  # runs once; the delay to its next run, or None
BATCH = 32  # tasks a worker takes at once (by default)


class Lateness:
    """Seconds by which something ran later than due, kept until taken."""

    def __init__(self) -> None:
        self._seen: list[float] = []
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seen.append(seconds)

    def take(self) -> dict[str, float | int]:
        """The median, 99th percentile and worst since the last take, and their number."""
        with self._lock:
            seen, self._seen = sorted(self._seen), []
        if not seen:
            return {"n": 0}
        return {
            "n": len(seen),
            "p50_ms": round(seen[len(seen) // 2] * 1000, 2),
            "p99_ms": round(seen[min(len(seen) - 1, len(seen) * 99 // 100)] * 1000, 2),
            "max_ms": round(seen[-1] * 1000, 2),
        }


class Loop:
    def __init__(self, workers: int, name: str = "sim-loop", batch: int = BATCH) -> None:
        """batch: tasks a worker takes at once; 1 where a task's store calls block for
        long (etcd): a slow one then holds up no other."""
        self._batch = batch
        self.lateness = Lateness()
        self.durations = Lateness()  # how long each task ran (its store calls included)
        self._heap: list[tuple[float, int, Task]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def call_later(self, delay: float, task: Task) -> None:
        due = time.monotonic() + delay
        with self._ready:
            heapq.heappush(self._heap, (due, next(self._order), task))
            if self._heap[0][2] is task:
                self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()

    def _next(self) -> list[tuple[float, Task]] | None:
        """Up to BATCH tasks due now (one lock and no wakeup per task), or None: stopped."""
        with self._ready:
            while not self._stopped:
                if self._heap:
                    now = time.monotonic()
                    wait = self._heap[0][0] - now
                    if wait <= 0:
                        batch = []
                        while self._heap and self._heap[0][0] <= now and len(batch) < self._batch:
                            due, _n, task = heapq.heappop(self._heap)
                            batch.append((due, task))
                        if self._heap and self._heap[0][0] <= now:
                            self._ready.notify()  # more are due: another worker takes them
                        return batch
                    self._ready.wait(wait)
                else:
                    self._ready.wait()
            return None

    def _work(self) -> None:
        while (batch := self._next()) is not None:
            again = []
            for due, task in batch:
                started = time.monotonic()
                self.lateness.add(started - due)
                delay = task()
                self.durations.add(time.monotonic() - started)
                if delay is not None:
                    again.append((started + delay, task))
            with self._ready:
                for due, task in again:
                    heapq.heappush(self._heap, (due, next(self._order), task))


class RunSlots:
    """At most `slots` joins run at once; a join's clock gives its slot up to sleep."""

    def __init__(self, slots: int) -> None:
        self._slots = threading.Semaphore(slots)
        self.waited = Lateness()
        self.clock = Clock(time.monotonic, self._sleep)

    def _take(self) -> None:
        started = time.monotonic()
        self._slots.acquire()
        self.waited.add(time.monotonic() - started)

    def _sleep(self, seconds: float) -> None:
        self._slots.release()
        time.sleep(seconds)
        self._take()

    def __enter__(self) -> RunSlots:
        self._take()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._slots.release()
