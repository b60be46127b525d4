"""The Agent's loop (join, start, watch, decide, again), driven in process: the real
Agent, rendezvous, fault policy, monitor, observer and job end, over torch's HashStore
behind FaultyStore, on a fake clock. Only the generations' starter is the test's: its
worker group runs no processes and ends as the test's script says (the pool is started,
with nothing preloaded, and never asked for a worker)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtrain.agent.agent import Agent
from rtrain.agent.faults import FaultPolicy
from rtrain.agent.generation import Generation, Joined, generation_topology, membership_rank
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.rendezvous.lease import Leases
from rtrain.agent.state import AgentState
from rtrain.agent.store.backends import JobStore
from rtrain.agent.workers.hang_watch import HangWatch
from rtrain.core.config.launch_spec import LaunchSpec
from rtrain.core.errors import ExitCode
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import Membership, StoreKeys

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store

FLAGS = ("--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--preload=none")


@dataclass
class PaperWorker:
    local_rank: int
    rank: int
    pid: int = 0
    exitcode: int | None = None  # as Worker's; the repair's view reads it


class PaperGroup:
    """A generation's workers without processes: each poll is `timeout` on the fake
    clock; after `polls` of them the workers exit as `fails` says."""

    def __init__(self, clock: FakeClock, generation: int, fails: bool, polls: int = 5) -> None:
        self._clock = clock
        self._generation = generation
        self._fails = fails
        self._left = polls
        self.workers = [PaperWorker(0, 0)]
        self.stopped: list[int] = []
        self.warm_up_wait_s = 0.0  # as WorkerGroup's: no pool to wait for

    def start(self) -> None:
        pass

    def poll(self, timeout: float) -> None:
        self._clock.sleep(timeout)
        self._left -= 1

    @property
    def _done(self) -> bool:
        return self._left <= 0

    @property
    def running(self) -> list[PaperWorker]:
        return [] if self._done else self.workers

    @property
    def failed(self) -> list[PaperWorker]:
        return self.workers if self._done and self._fails else []

    @property
    def succeeded(self) -> bool:
        return self._done and not self._fails

    def stop(self, sig: int, timeout: float) -> None:
        self.stopped.append(sig)

    def failure_records(self, host: str) -> list[FailureRecord]:
        if not self.failed:
            return []
        return [
            FailureRecord(
                kind=FailureKind.EXIT,
                generation=self._generation,
                node_rank=0,
                host=host,
                time=self._clock.wall(),
                rank=0,
                exitcode=1,
            )
        ]

    def stopped_records(self, host: str) -> list[FailureRecord]:
        return []


class PaperStarter:
    """Starts each generation as GenerationStarter does its part in the job (its rank,
    its lease, its peers' leases, the grid), with a PaperGroup; `fails` says, by
    generation, whether its workers fail."""

    def __init__(self, spec: LaunchSpec, clock: FakeClock, beats: Path, fails: list[bool]):
        self.joined: Joined | None = None
        self._spec = spec
        self._clock = clock
        self._beats = beats
        self._fails = fails
        self.started: list[int] = []

    def start(
        self,
        rdzv: JobRendezvous,
        membership: Membership,
        previous: Generation | None,
        policy: FaultPolicy,
        leases: Leases,
    ) -> Generation:
        generation = membership.generation
        node_rank = membership_rank(membership, membership.members[0].node_id)
        peers = leases.peers(generation, node_rank, len(membership.members))
        self.joined = Joined(membership, node_rank, peers)
        leases.hold(generation, node_rank)
        self.started.append(generation)
        group = PaperGroup(self._clock, generation, self._fails[generation])
        hangs = HangWatch(self._spec.faults.hang_timeout, str(self._beats), self._clock.clock)
        topology = generation_topology(self._spec.layout, membership, None)
        return Generation(membership, node_rank, group, peers, hangs, topology)  # type: ignore[arg-type]

    def spare_spawner(self) -> Any:
        raise AssertionError("a one-node job has no standby")


class Job:
    """One node's agent (a one-node job), its store and its clock."""

    def __init__(self, tmp_path: Path, fails: list[bool], *flags: str) -> None:
        self.clock = FakeClock()
        self.store = FaultyStore(memory_store())
        self.spec = launch_spec("--nnodes=1", *FLAGS, f"--log-dir={tmp_path}", *flags)
        self.starter = PaperStarter(self.spec, self.clock, tmp_path, fails)
        self.keys = StoreKeys(self.spec.rdzv.run_id)

        def open_store() -> JobStore:
            return JobStore(self.store, is_host=True, connect=lambda: self.store)

        self.agent = Agent(
            self.spec, {}, 1, clock=self.clock.clock, starter=self.starter, open_store=open_store
        )

    def events(self) -> list[dict[str, object]]:
        path = Path(self.agent.run_log_dir) / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_failed_generation_is_charged_restarted_and_the_next_one_finishes(tmp_path):
    job = Job(tmp_path, [True, False], "--max-restarts=1")
    result = job.agent.run()
    assert (result.state, result.exit_code, result.generation) == (
        AgentState.SUCCEEDED,
        ExitCode.SUCCESS,
        1,
    )
    assert job.starter.started == [0, 1]
    # node 0 reports what the job recovered from: generation 0's failure
    assert [(f.kind, f.generation) for f in result.failures] == [(FailureKind.EXIT, 0)]
    ends = [e["outcome"] for e in job.events() if e["event"] == "generation_end"]
    assert ends == ["local_failure", "succeeded"]
    assert job.store.inner.counter(job.keys.restart_claim(0)) == 1
    assert job.clock.slept > 0  # every wait was on the fake clock


def test_an_exhausted_budget_ends_the_job_and_writes_the_abort_record(tmp_path):
    job = Job(tmp_path, [True], "--max-restarts=0")
    result = job.agent.run()
    assert (result.state, result.exit_code) == (AgentState.FAILED, ExitCode.JOB_FAILED)
    assert "max_restarts=0 exhausted" in result.message
    assert job.starter.started == [0]
    abort = job.store.inner.get(job.keys.abort)
    assert abort is not None and b"max_restarts=0 exhausted" in abort
    assert [f.generation for f in result.failures] == [0]


def test_a_store_lost_while_a_generation_runs_is_a_tempfail(tmp_path):
    job = Job(tmp_path, [False], "--max-restarts=1")
    # the group runs 5 polls of --monitor-interval; the store goes before they end
    job.clock.at(job.spec.monitor_interval * 2, job.store.stop)
    result = job.agent.run()
    assert (result.state, result.exit_code) == (AgentState.FAILED, ExitCode.TEMPFAIL)
    assert "lost the rendezvous store" in result.message
    assert job.starter.started == [0]
    group = job.agent._gen.group if job.agent._gen is not None else None
    assert group is not None and signal.SIGTERM in group.stopped  # type: ignore[attr-defined]
