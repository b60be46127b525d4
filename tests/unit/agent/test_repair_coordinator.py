"""RepairCoordinator (agent/repair/coordinator.py) carrying out the repair decisions on
a fake clock: workers are Worker records whose answers are real control files written
at scheduled times, processes' states are a table, the job's fallback count lives on
torch's real HashStore. Each case runs in milliseconds of real time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rtrain.agent.rendezvous.kept_ranks import KeptRanks
from rtrain.agent.repair.coordinator import ACK_S, RepairCoordinator
from rtrain.agent.repair.fallback import FALLBACK_AFTER
from rtrain.agent.workers.group import Worker
from rtrain.core.contract.environment import KEPT_RANKS
from rtrain.core.contract.repair_files import (
    PARKED,
    REQUEST_FILE,
    RUNNING,
    STUCK,
    WorkerState,
    decode_resume,
    encode_state,
)
from rtrain.core.observe.events import Event
from rtrain.core.rendezvous.keys import StoreKeys
from tests.unit.agent.fakes import FakeClock, memory_store

GEN = 2


class FakeGroup:
    """The worker group as the coordinator drives it: poll() is the fake clock's sleep
    (scheduled answers and exits happen in it), leave_out() kills at once."""

    def __init__(self, clock: FakeClock, count: int) -> None:
        self.clock = clock
        self.workers = [Worker(i, 10 + i, "", "", pid=100 + i) for i in range(count)]
        self.preforked: list[int] = []
        self.left: list[int] = []
        self.handover: Any = None
        self.assignment: Any = None

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.exitcode is None]

    def poll(self, timeout: float) -> None:
        self.clock.sleep(timeout)

    def prefork(self, local_ranks: list[int]) -> None:
        self.preforked.extend(local_ranks)

    def leave_out(self, local_ranks: list[int]) -> None:
        for worker in self.running:
            if worker.local_rank in local_ranks:
                worker.left_out, worker.exitcode = True, -9
                self.left.append(worker.local_rank)


class Job:
    """One node's view of a job: its coordinator, group, generation and store."""

    def __init__(self, tmp_path: Path, count: int = 3, store: Any = None) -> None:
        self.clock = FakeClock()
        self.processes: dict[int, str | None] = {}
        self.repair = RepairCoordinator(
            str(tmp_path),
            resume_wait_s=60.0,
            clock=self.clock.clock,
            wall=self.clock.now,
            process=lambda pid: self.processes.get(pid, "running"),
        )
        self.group = FakeGroup(self.clock, count)
        self.gen: Any = SimpleNamespace(
            group=self.group, number=GEN, node_rank=0, hangs=SimpleNamespace(timeout=4.0)
        )
        store = store or memory_store()
        keys = StoreKeys("job")
        ended = SimpleNamespace(raise_if_ended=lambda generation, watch: None)
        kept = KeptRanks(store, keys, ended, self.clock.clock)  # type: ignore[arg-type]
        self.rdzv: Any = SimpleNamespace(store=store, keys=keys, kept=kept)
        for worker in self.group.workers:
            self.say(worker.local_rank, RUNNING)

    def say(self, local_rank: int, state: str, at: float | None = None) -> None:
        """Worker `local_rank` writes its state file (now, or `at` seconds from now)."""
        control = self.repair.control(local_rank)
        pid = 100 + local_rank

        def write() -> None:
            Path(control.folder).mkdir(parents=True, exist_ok=True)
            data = encode_state(WorkerState(state, GEN, pid))
            (Path(control.folder) / "state.json").write_bytes(data)

        if at is None:
            write()
        else:
            self.clock.at(at, write)

    def crash(self, local_rank: int, at: float | None = None) -> None:
        worker = self.group.workers[local_rank]

        def exit_now() -> None:
            worker.exitcode = 1

        exit_now() if at is None else self.clock.at(at, exit_now)

    def asked(self, local_rank: int) -> bool:
        return (Path(self.repair.control(local_rank).folder) / REQUEST_FILE).exists()


def _repair(events: list[Event]) -> dict[str, Any]:
    (found,) = [e.fields for e in events if e.name == "repair"]
    return found


def test_a_crash_keeps_the_survivors_that_park(tmp_path: Path, events: list[Event]) -> None:
    job = Job(tmp_path)
    job.crash(1)
    job.say(0, PARKED, at=0.2)
    job.say(2, PARKED, at=0.3)
    assert job.repair.park(job.gen, job.rdzv)
    assert job.asked(0) and job.asked(2) and not job.asked(1)
    assert job.group.preforked == [1] and job.group.left == []
    assert job.clock.slept < 0.5  # the answers ended the wait, not ACK_S
    found = _repair(events)
    assert found["kept"] == [10, 12] and found["restarted"] == [11]
    assert found["fallback"] == [] and found["stuck"] == [] and not found["job_fallback"]


def test_a_survivor_that_never_answers_is_replaced_after_the_wait(
    tmp_path: Path, events: list[Event]
) -> None:
    job = Job(tmp_path)
    job.crash(1)
    job.say(0, PARKED, at=0.1)  # rank 2 never answers
    assert job.repair.park(job.gen, job.rdzv)
    assert ACK_S <= job.clock.slept < ACK_S + 0.1
    assert job.group.left == [2] and job.group.preforked == [1, 2]
    found = _repair(events)
    assert found["kept"] == [10] and found["restarted"] == [11, 12] and found["fallback"] == [12]


def test_a_stuck_release_is_replaced_at_once(tmp_path: Path, events: list[Event]) -> None:
    job = Job(tmp_path)
    job.crash(0)
    job.say(1, PARKED, at=0.1)
    job.say(2, STUCK, at=0.2)
    assert job.repair.park(job.gen, job.rdzv)
    assert job.clock.slept < 0.5
    assert job.group.left == [2] and _repair(events)["stuck"] == [12]


def test_a_survivor_stopped_before_it_answers_is_replaced_without_the_wait(
    tmp_path: Path, events: list[Event]
) -> None:
    job = Job(tmp_path)
    job.crash(0)
    job.say(1, PARKED, at=0.1)
    job.processes[102] = "stopped"  # SIGSTOP: it can answer nothing
    assert job.repair.park(job.gen, job.rdzv)
    assert job.clock.slept < 0.5
    assert job.group.left == [2] and _repair(events)["kept"] == [11]


def test_a_second_fault_while_parking_is_not_kept(tmp_path: Path, events: list[Event]) -> None:
    job = Job(tmp_path)
    job.crash(0)
    job.say(1, PARKED, at=0.1)
    job.crash(2, at=0.2)  # dies while the others park
    assert job.repair.park(job.gen, job.rdzv)
    found = _repair(events)
    assert found["kept"] == [11] and found["restarted"] == [10, 12]
    assert job.group.left == []  # it exited on its own: nothing to stop


def test_no_park_on_a_gpu_fault_or_without_opting_in(tmp_path: Path, events: list[Event]) -> None:
    job = Job(tmp_path)
    job.crash(0)
    assert not job.repair.park(job.gen, job.rdzv, gpu_fault=True)
    assert not job.asked(1) and job.group.preforked == []
    plain = Job(tmp_path / "plain")
    for worker in plain.group.workers:  # never called rtrain.repairable
        Path(plain.repair.control(worker.local_rank).folder, "state.json").unlink()
    assert not plain.repair.park(plain.gen, plain.rdzv)
    assert not [e for e in events if e.name == "repair"]


def test_no_park_and_no_repair_event_when_the_job_is_about_to_end(
    tmp_path: Path, events: list[Event]
) -> None:
    job = Job(tmp_path)
    job.crash(0)
    assert not job.repair.park(job.gen, job.rdzv, restarts_left=False)
    assert not job.asked(1) and not [e for e in events if e.name == "repair"]


def test_two_failed_repairs_turn_repair_off_for_the_job(
    tmp_path: Path, events: list[Event]
) -> None:
    store = memory_store()
    for attempt in range(FALLBACK_AFTER):
        job = Job(tmp_path / str(attempt), store=store)
        job.gen.number = GEN + attempt
        for worker in job.group.workers:
            Path(job.repair.control(worker.local_rank).folder, "state.json").write_bytes(
                encode_state(WorkerState(RUNNING, GEN + attempt, worker.pid))
            )
        job.crash(0)  # nobody answers: the repair fails
        assert not job.repair.park(job.gen, job.rdzv)
    assert not job.repair.enabled
    assert [e.fields["failed_generations"] for e in events if e.name == "repair_fallback"] == [
        [GEN, GEN + 1]
    ]
    again = Job(tmp_path / "again", store=store)  # another node reads the record
    again.crash(0)
    assert not again.repair.park(again.gen, again.rdzv) and not again.asked(1)


def test_the_hand_over_names_the_kept_process_and_ends_a_stopped_one(
    tmp_path: Path, events: list[Event]
) -> None:
    job = Job(tmp_path)
    job.crash(0)
    job.say(1, PARKED, at=0.1)
    job.say(2, PARKED, at=0.1)
    assert job.repair.park(job.gen, job.rdzv)
    job.processes[102] = "stopped"  # stopped after it was counted as kept
    nxt = FakeGroup(job.clock, 3)
    nxt.assignment = SimpleNamespace(global_rank=lambda local: 20 + local, local_world_size=3)
    # node 1 of the generation kept ranks 23 and 24 (its key written before ours)
    job.rdzv.store.set(job.rdzv.keys.kept(GEN + 1, 1), "24,23")
    gen: Any = SimpleNamespace(
        group=nxt,
        number=GEN + 1,
        node_rank=0,
        membership=SimpleNamespace(members=[SimpleNamespace(local_world_size=3)] * 2),
        hangs=SimpleNamespace(timeout=4.0),
    )
    job.repair.hand_over(gen, job.rdzv)
    seam = nxt.handover
    # every worker learns every member's kept ranks: the stopped one is not among them
    assert seam.env(0)[KEPT_RANKS] == "21,23,24"
    assert job.rdzv.store.get(job.rdzv.keys.kept(GEN + 1, 0)) == b"21"
    assert seam.resume(1, {"RANK": "1"}) == 101
    resume = Path(job.repair.control(1).folder, "resume.json").read_bytes()
    assert decode_resume(resume).pid == 101  # type: ignore[union-attr]
    assert seam.resume(2, {"RANK": "2"}) is None and seam.stale(2) == 102
    assert seam.stale(2) is None  # ended once
    assert seam.resume(0, {}) is None and seam.stale(0) is None  # a crashed one: fresh
    (lost,) = [e.fields for e in events if e.name == "repair_lost"]
    assert lost == {"from_generation": GEN, "rank": 12, "pid": 102, "why": "stopped while parked"}
