"""RestartBackoff on a fake clock: how long a node whose workers keep failing waits."""

from __future__ import annotations

import pytest

from rtrain.agent.restart_backoff import RestartBackoff

from .fakes import FakeClock


def test_a_generation_that_ran_long_resets_the_backoff() -> None:
    clock = FakeClock()
    backoff = RestartBackoff(1.0, clock.clock)
    waits = []
    for lived in (1.0, 1.0, 1.0, 120.0, 1.0):
        backoff.started()
        clock.time += lived
        before = clock.time
        backoff.failed(lambda: None)
        waits.append(round(clock.time - before, 3))
    assert waits == [0.0, 1.0, 2.0, 0.0, 1.0]


def test_a_signal_ends_the_wait() -> None:
    clock = FakeClock()
    backoff = RestartBackoff(10.0, clock.clock)
    for _ in range(2):  # immediate, then 10 s: the next wait is 20 s
        backoff.started()
        backoff.failed(lambda: None)
    before = clock.slept

    def signalled() -> None:
        if clock.slept - before > 1.0:
            raise KeyboardInterrupt

    backoff.started()
    with pytest.raises(KeyboardInterrupt):
        backoff.failed(signalled)
    assert 1.0 < clock.slept - before <= 1.2  # the 20 s wait ended at the signal
