"""The zygote's spares (agent/workers/spare.py) against real forked children and a real
SIGCHLD handler that reaps them, as the zygote's does: dropping the spares while the
handler reaps them must neither raise nor report a spare's exit as a worker's.

Found by CI's loaded pass: a generation's `drop_spares` killed a spare, its SIGCHLD ran
inside the drop's loop and took the spare out of the dictionary being walked; the
zygote died of "dictionary changed size during iteration" and took the node's
workers with it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from rtrain.agent.workers.spare import Spares


@pytest.fixture
def reaping() -> Iterator[tuple[Spares, list[int], list[int]]]:
    """Spares with a SIGCHLD handler that reaps their children (only theirs: pytest's
    own children are not this test's) and records any exit it would report."""
    spares = Spares()
    forked: list[int] = []
    reported: list[int] = []

    def reap(*_: object) -> None:
        for pid in list(forked):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                forked.remove(pid)
                if not spares.reaped(pid):
                    reported.append(pid)

    previous = signal.signal(signal.SIGCHLD, reap)
    try:
        yield spares, forked, reported
    finally:
        signal.signal(signal.SIGCHLD, previous)
        for pid in forked:
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def fork_spares(spares: Spares, forked: list[int], count: int) -> None:
    for n in range(count):
        spares.fork(f"w{n}", os.getpid(), [])
        forked.append(spares._waiting[f"w{n}"].pid)


def test_spares_dropped_while_the_handler_reaps_them_are_all_gone_unreported(
    reaping, monkeypatch
) -> None:
    spares, forked, reported = reaping
    fork_spares(spares, forked, 4)
    real_kill = os.kill

    def kill_and_wait_for_death(pid: int, sig: int) -> None:
        # Each spare is dead before the drop goes on, so its SIGCHLD handler runs
        # inside the drop's loop, as it did under CI's load.
        real_kill(pid, sig)
        with contextlib.suppress(ChildProcessError):  # the handler reaped it already
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)

    monkeypatch.setattr(os, "kill", kill_and_wait_for_death)
    spares.drop()
    monkeypatch.undo()
    for pid in list(forked):
        reap(pid, forked, spares, reported)
    assert reported == []
    assert forked == []
    assert spares.fds == []
    assert spares._dropped == set()  # each dropped pid was reaped once, and forgotten


def test_a_spare_that_dies_waiting_is_reaped_and_not_reported(reaping) -> None:
    spares, forked, reported = reaping
    fork_spares(spares, forked, 2)
    victim = forked[0]
    os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # the handler reaped it already
        os.waitid(os.P_PID, victim, os.WEXITED | os.WNOWAIT)
    reap(victim, forked, spares, reported)
    assert "w0" not in spares and "w1" in spares
    assert reported == []


def reap(pid: int, forked: list[int], spares: Spares, reported: list[int]) -> None:
    """Reap `pid` unless the handler did (its signal may still be pending)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # the handler reaped it meanwhile
        return
    forked.remove(pid)
    if not spares.reaped(pid):
        reported.append(pid)
