"""Waiting without a clock of its own: every poll loop of rtrain is wait_until.

The clock and the sleep are passed in, so this module (like all of core outside
core/worker) never reads time or sleeps by itself, and a test drives any loop built
on it with a fake clock (tests/unit/agent/fakes.py) in microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """A monotonic clock and the sleep that goes with it."""

    now: Callable[[], float]
    sleep: Callable[[float], None]

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None, poll: float) -> bool:
        """wait_until on this clock."""
        return wait_until(predicate, timeout, poll, self.now, self.sleep)


def wait_until(
    predicate: Callable[[], bool],
    timeout: float | None,
    poll: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> bool:
    """Call predicate every `poll` seconds until it is true (True) or `timeout` seconds
    have passed (False; None waits for ever). The predicate runs at least once, and
    once more at the deadline, so a condition met during the last sleep is seen.
    Exceptions from the predicate (a signal, an abort record) pass through."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        if predicate():
            return True
        now = clock()
        if deadline is not None and now >= deadline:
            return False
        pause = poll if deadline is None else min(poll, deadline - now)
        sleep(max(pause, 0.0))
