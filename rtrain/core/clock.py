"""Waiting without a clock of its own: every poll loop of rtrain is wait_until.

The clock and the sleep are passed in, so this module (like all of core outside
core/worker) never reads time or sleeps by itself, and a test drives any loop built
on it with a fake clock (tests/unit/agent/fakes.py) in microseconds. The agent's one
clock is agent/waiting.py's SYSTEM_CLOCK, handed down to every part that reads time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """A monotonic clock, the sleep that goes with it, and the wall clock.

    now: durations, deadlines and timeouts; sleep: the pause of a poll; epoch: seconds
    since the epoch, for the times an event or a record carries (compared with other
    processes' and hosts'). A clock given no epoch (a simulation's) has one time: now."""

    now: Callable[[], float]
    sleep: Callable[[float], None]
    epoch: Callable[[], float] | None = None

    def wall(self) -> float:
        """Wall-clock time: `epoch` where given, else `now`."""
        return self.now() if self.epoch is None else self.epoch()

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
