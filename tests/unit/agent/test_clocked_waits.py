"""The agent's waits and stamps on a fake clock (issue 45 item 4): a worker group's waits
for exits after a SIGKILL and a stop, the XID wait of the GPU checks, a rate-limited
warning and the event sink's times each follow the clock they are handed, in no real
time."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from rtrain.agent.health.fake_nvml import FakeNvml
from rtrain.agent.health.nvml_reader import collect_xids
from rtrain.agent.net.limits import RateLimitedLog
from rtrain.agent.observe.events import EVENTS, emit
from rtrain.agent.waiting import SYSTEM_CLOCK
from rtrain.agent.workers.group import KILL_WAIT_S, WorkerGroup
from rtrain.agent.workers.hang_watch import HangFinding
from rtrain.agent.workers.pool import WorkerExit
from rtrain.agent.workers.records import Worker
from rtrain.core.observe.events import read_events

from .fakes import FAKE_EPOCH, FakeClock, launch_spec

NO_PID = 2**22 + 7  # no process has it: never seen held


class PaperPool:
    """A worker pool without processes: a poll waits its timeout on the fake clock and
    hands over the exits scheduled by then (FakeClock.at)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.signals: list[tuple[str, int]] = []
        self.exits: list[WorkerExit] = []

    def signal(self, worker_id: str, sig: int) -> None:
        self.signals.append((worker_id, sig))

    def signal_all(self, sig: int) -> None:
        self.signals.append(("all", sig))

    def poll_exits(self, timeout: float) -> list[WorkerExit]:
        self.clock.sleep(timeout)
        exits, self.exits = self.exits, []
        return exits


def _group(clock: FakeClock, pool: PaperPool, tmp_path: Path) -> WorkerGroup:
    spec = launch_spec("--nnodes=1", "--nproc-per-node=2")
    tail = SimpleNamespace(flush_and_reset=lambda: None)
    group = WorkerGroup(pool, spec, None, str(tmp_path), {}, tail, clock=clock.clock)  # type: ignore[arg-type]
    group.workers = [
        Worker(r, r, str(tmp_path), str(tmp_path / f"error{r}.json"), pid=NO_PID + r)
        for r in range(2)
    ]
    return group


def test_a_hung_worker_whose_exit_never_comes_is_marked_killed_after_the_kill_wait(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    pool = PaperPool(clock)
    group = _group(clock, pool, tmp_path)
    worker = group.workers[0]
    finding = HangFinding(
        "hung: no heartbeat for 9.0s", "(stack)", FAKE_EPOCH + 991.0, False, False
    )
    group.kill_hung(worker, finding)
    assert pool.signals == [("0", signal.SIGKILL)]
    assert clock.slept == pytest.approx(KILL_WAIT_S)  # polling the pool was the wait
    assert worker.exitcode == -signal.SIGKILL and worker.exit_time == clock.wall()
    assert worker.hang is finding and group.running == [group.workers[1]]


def test_a_stop_waits_its_timeout_then_kills_the_workers_that_ignored_it(tmp_path: Path) -> None:
    clock = FakeClock()
    pool = PaperPool(clock)
    group = _group(clock, pool, tmp_path)
    # rank 0 ends a second after the SIGTERM; rank 1 ignores it, and its SIGKILL's exit
    # never comes (its pool lost it)
    clock.at(1.0, lambda: pool.exits.append(WorkerExit("0", NO_PID, -15, clock.wall())))
    group.stop(signal.SIGTERM, 3.0)
    assert pool.signals == [("all", signal.SIGTERM), ("all", signal.SIGKILL)]
    assert clock.slept == pytest.approx(3.0 + KILL_WAIT_S)
    first, second = group.workers
    assert first.exitcode == -15  # at its second, found within one 0.05 s poll
    assert first.exit_time == pytest.approx(FAKE_EPOCH + 1001.0, abs=0.06)
    assert second.exitcode == -signal.SIGKILL and second.exit_time == clock.wall()
    assert first.stopped_by_agent and second.stopped_by_agent
    assert group.failed == []  # the agent's doing, both


def test_an_exit_stamped_before_the_stop_is_a_failure_however_late_it_is_reported(
    tmp_path: Path,
) -> None:
    """The pool's exit times and the stop's are both wall-clock: compared on one clock."""
    clock = FakeClock()
    pool = PaperPool(clock)
    group = _group(clock, pool, tmp_path)
    exited = WorkerExit("0", NO_PID, 1, clock.wall() - 0.5)  # failed just before the stop
    clock.at(0.2, lambda: pool.exits.append(exited))
    clock.at(0.3, lambda: pool.exits.append(WorkerExit("1", NO_PID + 1, -15, clock.wall())))
    group.stop(signal.SIGTERM, 3.0)
    assert clock.slept < 0.5  # both exits in: the stop ends there, not at its 3 s
    assert [w.local_rank for w in group.failed] == [0]


def test_an_xid_due_in_the_scenario_is_collected_on_the_clock_it_is_waited_on() -> None:
    clock = FakeClock()
    nvml = FakeNvml({"gpus": [{"timeline": [{"at": 30, "xid": 79}]}]}, clock.clock)
    nvml.nvmlInit()
    (event,) = collect_xids(nvml, 1, 60.0, clock.clock)
    assert (event.gpu, event.xid) == (0, 79)
    assert event.time == pytest.approx(FAKE_EPOCH + 1030.0, abs=0.06)  # the fake wall's
    assert clock.slept == pytest.approx(60.0, abs=0.06)  # the whole wait, none of it real


def test_a_rate_limited_warning_counts_what_it_held_back_on_its_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("clocked"), 60.0, clock.clock)
    with caplog.at_level(logging.WARNING, "clocked"):
        log.warn("cap", "refused")
        log.warn("cap", "refused")
        clock.sleep(59.0)
        log.warn("cap", "refused")  # within the minute: held back, counted
        clock.sleep(1.0)
        log.warn("cap", "refused")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["refused", "refused (2 more like it since the last report)"]


def test_events_are_stamped_by_the_wall_clock_the_agent_hands_the_sink(tmp_path: Path) -> None:
    clock = FakeClock()
    EVENTS.start("10.0.0.1", clock.wall)
    EVENTS.open(str(tmp_path), "10.0.0.1")
    try:
        clock.sleep(2.5)
        emit("job_end", exit_code=0, message="done")
    finally:
        EVENTS.close()
    (event,) = read_events((tmp_path / "events.jsonl").read_text().splitlines())[0]
    assert event.t == FAKE_EPOCH + 1002.5
    assert EVENTS.wall == SYSTEM_CLOCK.wall  # closed: the process's own clock again


def test_a_stopped_worker_whose_error_file_the_stop_cut_off_is_not_a_root_cause(
    tmp_path: Path,
) -> None:
    """Rank 0 had written its error file whole before the stop (failing on its own);
    rank 1 was in the middle of writing its own when the SIGTERM ended it: not JSON,
    it says nothing of a failure of its own (a loaded CI run counted it a root cause)."""
    clock = FakeClock()
    pool = PaperPool(clock)
    group = _group(clock, pool, tmp_path)
    (tmp_path / "error0.json").write_text('{"message": {"message": "RuntimeError: gloo"}}')
    (tmp_path / "error1.json").write_text('{"message": {"message": "RuntimeErr')
    for name in ("error0.json", "error1.json"):  # both written before the stop began
        os.utime(tmp_path / name, (clock.wall() - 1.0, clock.wall() - 1.0))
    clock.at(0.2, lambda: pool.exits.append(WorkerExit("0", NO_PID, -15, clock.wall())))
    clock.at(0.3, lambda: pool.exits.append(WorkerExit("1", NO_PID + 1, -15, clock.wall())))
    group.stop(signal.SIGTERM, 3.0)
    assert [w.local_rank for w in group.failed] == [0]
    assert group.workers[1].stopped_by_agent and group.workers[1].exitcode == -15
