"""The per-node agent: an explicit state machine over rendezvous, workers and failures.

  INIT -> RENDEZVOUS -> HEALTHY -> SUCCEEDED
                 ^          |
                 |          v
                 +------ UNHEALTHY -> FAILED

Each pass through RENDEZVOUS is a new generation with a fresh worker store, so no
state of an earlier generation can reach a later one.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType
from typing import Any

from rtrain.agent import log
from rtrain.agent.log_tail import LogTail
from rtrain.agent.rendezvous import JobAborted, StoreRendezvous
from rtrain.agent.store import OpenedStore, host_store, open_rendezvous_store
from rtrain.agent.worker_pool import WorkerPool
from rtrain.agent.workers import WorkerGroup
from rtrain.core.errors import ExitCode, RendezvousError, RtrainError, exit_code_for_signal
from rtrain.core.failures import FailureRecord, root_cause_first
from rtrain.core.launch_spec import LaunchSpec
from rtrain.core.store_protocol import AbortRecord, MemberInfo, Membership

logger = logging.getLogger(__name__)

# Workers of a failed generation get this long after SIGTERM before SIGKILL.
RESTART_STOP_GRACE_S = 3.0
POLL_S = 0.02


class AgentState(str, Enum):
    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    LOCAL_FAILURE = "local failure"
    MEMBERSHIP_CHANGE = "membership change"


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class RunResult:
    state: AgentState
    exit_code: int
    message: str
    run_log_dir: str
    generation: int = 0
    failures: list[FailureRecord] = field(default_factory=list)


def make_run_log_dir(spec: LaunchSpec) -> str:
    base = spec.log_dir or tempfile.mkdtemp(prefix="rtrain_")
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{spec.rdzv.run_id}_", dir=base)


class Agent:
    def __init__(self, spec: LaunchSpec, base_env: Mapping[str, str], nproc: int) -> None:
        self.spec = spec
        self.nproc = nproc
        self.node_id = uuid.uuid4().hex
        self.addr = default_node_addr(spec)
        self.state = AgentState.INIT
        self.run_log_dir = make_run_log_dir(spec)
        self._base_env = dict(base_env)
        self._pool = WorkerPool(spec.preload, base_env)
        self._tail = LogTail()
        self._group: WorkerGroup | None = None
        self._signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._generation = 0
        self._restarts_used = 0
        self._node_rank: int | None = spec.node_rank
        self._worker_store: Any = None
        log.set_node(self.addr)

    # -- signals --

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signal = signum

    def _install_signal_handlers(self) -> None:
        for signum in self.spec.signals_to_handle:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _check_signal(self) -> None:
        if self._signal is not None:
            raise Interrupted(self._signal)

    # -- the run --

    def run(self) -> RunResult:
        self._install_signal_handlers()
        self._pool.start()
        try:
            return self._run()
        finally:
            if self._group is not None:
                self._group.stop(signal.SIGKILL, 1.0)
            self._pool.close()
            self._tail.close()
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)

    def _set_state(self, state: AgentState) -> None:
        if state != self.state:
            logger.debug("state %s -> %s", self.state.value, state.value)
            self.state = state

    def _run(self) -> RunResult:
        rdzv_spec = self.spec.rdzv
        try:
            opened = open_rendezvous_store(
                rdzv_spec.host,
                rdzv_spec.port,
                rdzv_spec.is_host,
                self.spec.local_addr,
                rdzv_spec.join_timeout,
                rdzv_spec.read_timeout,
            )
        except RendezvousError as exc:
            return self._result(AgentState.FAILED, exc.exit_code, str(exc))
        endpoint = f"{rdzv_spec.host}:{opened.port}"
        rdzv = StoreRendezvous(opened.store, self.spec, endpoint)
        try:
            return self._generations(rdzv, opened)
        except Interrupted as exc:
            return self._interrupted(rdzv, opened, exc.signum)
        except JobAborted as exc:
            return self._aborted(rdzv, exc.record)
        except RtrainError as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            return self._result(AgentState.FAILED, exc.exit_code, str(exc))

    def _generations(self, rdzv: StoreRendezvous, opened: OpenedStore) -> RunResult:
        while True:
            self._set_state(AgentState.RENDEZVOUS)
            member = MemberInfo(
                node_id=self.node_id,
                addr=self.addr,
                local_world_size=self.nproc,
                requested_rank=self.spec.node_rank,
                prev_rank=self._node_rank,
            )
            membership = rdzv.join(member, check_stop=self._check_signal)
            group = self._start_generation(rdzv, membership)
            self._set_state(AgentState.HEALTHY)
            outcome = self._monitor(rdzv, membership)
            generation = membership.generation
            if outcome is Outcome.SUCCEEDED:
                if self._exit_barrier(rdzv, opened, membership):
                    self._set_state(AgentState.SUCCEEDED)
                    return self._result(
                        AgentState.SUCCEEDED, ExitCode.SUCCESS, "all workers succeeded"
                    )
                logger.info("another node restarted the job after this node finished; rejoining")
                continue
            self._set_state(AgentState.UNHEALTHY)
            if outcome is Outcome.MEMBERSHIP_CHANGE:
                self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
                rdzv.open_next_round(generation)
                continue
            result = self._after_local_failure(rdzv, opened, membership, group)
            if result is not None:
                return result
            rdzv.open_next_round(generation)

    def _after_local_failure(
        self,
        rdzv: StoreRendezvous,
        opened: OpenedStore,
        membership: Membership,
        group: WorkerGroup,
    ) -> RunResult | None:
        """Record the failure; charge a restart if this node was first to report; maybe give up."""
        generation = membership.generation
        failures = group.failure_records(self.addr)
        self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
        for record in failures:
            rdzv.record_failure(record)
        first = root_cause_first(failures)[0]
        if not rdzv.claim_restart(generation):
            logger.info(
                "worker rank %s failed after another node reported a failure; "
                "this node is not charged a restart",
                first.rank,
            )
            return None
        if self._restarts_used >= self.spec.max_restarts:
            reason = (
                f"worker rank {first.rank} on node {first.node_rank} failed "
                f"(exit {first.describe_exit()}); "
                f"max_restarts={self.spec.max_restarts} exhausted"
            )
            node_rank = membership_rank(membership, self.node_id)
            rdzv.abort(AbortRecord(generation, node_rank, reason, ExitCode.JOB_FAILED))
            self._linger_after_abort(rdzv, opened, membership)
            return self._result(
                AgentState.FAILED,
                ExitCode.JOB_FAILED,
                reason,
                failures=rdzv.failures(generation, len(membership.members)),
            )
        self._restarts_used += 1
        logger.warning(
            "worker rank %s failed (exit %s); restarting the job (%d of %d restarts used)",
            first.rank,
            first.describe_exit(),
            self._restarts_used,
            self.spec.max_restarts,
        )
        return None

    def _start_generation(self, rdzv: StoreRendezvous, membership: Membership) -> WorkerGroup:
        generation = membership.generation
        self._generation = generation
        log.set_generation(generation)
        node_rank = membership_rank(membership, self.node_id)
        self._node_rank = node_rank
        log.set_node(f"node{node_rank}")
        self._worker_store = None  # the previous generation's store closes here
        if node_rank == 0:
            opened = host_store(self.addr, 0, self.spec.rdzv.read_timeout)
            self._worker_store = opened.store
            rdzv.publish_master(generation, self.addr, opened.port)
            master = (self.addr, opened.port)
        else:
            master = rdzv.wait_master(generation, self.spec.rdzv.join_timeout)
        assignment = membership.assignment(self.node_id, master[0], master[1])
        logger.info(
            "generation %d: %d nodes, world size %d, this node rank %d, worker store %s:%d",
            generation,
            assignment.num_nodes,
            assignment.world_size,
            node_rank,
            master[0],
            master[1],
        )
        self._pool.ensure_running()
        group = WorkerGroup(
            self._pool, self.spec, assignment, self.run_log_dir, self._base_env, self._tail
        )
        self._group = group
        group.start()
        return group

    def _monitor(self, rdzv: StoreRendezvous, membership: Membership) -> Outcome:
        group = self._group
        assert group is not None
        generation = membership.generation
        room_to_grow = len(membership.members) < self.spec.nodes.max_nodes
        while True:
            self._check_signal()
            group.poll(self.spec.monitor_interval)
            if group.failed:
                return Outcome.LOCAL_FAILURE
            if group.succeeded:
                return Outcome.SUCCEEDED
            rdzv.raise_if_aborted()
            if rdzv.round_moved_past(generation):
                logger.info("another node started generation %d; restarting", generation + 1)
                return Outcome.MEMBERSHIP_CHANGE
            if room_to_grow and rdzv.waiting_nodes(generation) > 0:
                logger.info("a new node is waiting to join; restarting to admit it")
                return Outcome.MEMBERSHIP_CHANGE

    def _exit_barrier(
        self, rdzv: StoreRendezvous, opened: OpenedStore, membership: Membership
    ) -> bool:
        """Wait for every node to finish; False if the job moved to a new generation instead."""
        generation, size = membership.generation, len(membership.members)
        rdzv.mark_done(generation)
        while rdzv.done_count(generation) < size:
            self._check_signal()
            rdzv.raise_if_aborted()
            if rdzv.round_moved_past(generation):
                return False
            time.sleep(POLL_S)
        rdzv.mark_exited(generation)
        if opened.is_host:  # keep the store up until every node has seen the barrier pass
            self._wait_count(lambda: rdzv.exited_count(generation), size)
        return True

    def _wait_count(self, read: Callable[[], int], expected: int) -> None:
        end = time.monotonic() + self.spec.rdzv.close_timeout
        try:
            while read() < expected and time.monotonic() < end:
                time.sleep(POLL_S)
        except RendezvousError:
            pass

    def _linger_after_abort(
        self, rdzv: StoreRendezvous, opened: OpenedStore, membership: Membership
    ) -> None:
        if opened.is_host:  # let the others read why before the store goes away
            self._wait_count(rdzv.abort_acks, len(membership.members) - 1)

    def _stop_group(self, sig: int, timeout: float) -> None:
        if self._group is not None:
            self._group.stop(sig, timeout)

    def _interrupted(self, rdzv: StoreRendezvous, opened: OpenedStore, signum: int) -> RunResult:
        name = signal.Signals(signum).name
        logger.warning(
            "received %s; stopping workers (up to %gs)", name, self.spec.shutdown_timeout
        )
        self._stop_group(signum, self.spec.shutdown_timeout)
        node = self._node_rank if self._node_rank is not None else -1
        try:
            rdzv.abort(
                AbortRecord(
                    self._generation, node, f"node {node} received {name}", ExitCode.TEMPFAIL
                )
            )
            if opened.is_host:
                self._wait_count(rdzv.abort_acks, self._known_peers())
        except RendezvousError:
            pass
        return self._result(AgentState.FAILED, exit_code_for_signal(signum), f"stopped by {name}")

    def _known_peers(self) -> int:
        group = self._group
        return max(group.assignment.num_nodes - 1, 0) if group is not None else 0

    def _aborted(self, rdzv: StoreRendezvous, record: AbortRecord) -> RunResult:
        self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
        failures: list[FailureRecord] = []
        try:
            rdzv.ack_abort()
            group = self._group
            if group is not None:
                failures = rdzv.failures(record.generation, group.assignment.num_nodes)
        except RendezvousError:
            pass
        return self._result(
            AgentState.FAILED,
            record.exit_code,
            f"job ended by node {record.node_rank}: {record.reason}",
            failures,
        )

    def _result(
        self,
        state: AgentState,
        code: int,
        message: str,
        failures: list[FailureRecord] | None = None,
    ) -> RunResult:
        return RunResult(
            state=state,
            exit_code=int(code),
            message=message,
            run_log_dir=self.run_log_dir,
            generation=self._generation,
            failures=root_cause_first(failures or []),
        )


def default_node_addr(spec: LaunchSpec) -> str:
    """This node's address as peers reach it; torchrun's choice where it makes one."""
    if spec.local_addr:
        return spec.local_addr
    if spec.standalone:
        return "localhost"
    if spec.rdzv.backend == "static" and spec.node_rank == 0:
        return spec.rdzv.host  # node 0 is --master-addr by definition
    return socket.getfqdn()


def membership_rank(membership: Membership, node_id: str) -> int:
    rank = membership.node_rank_of(node_id)
    if rank is None:
        raise RendezvousError(f"this node is not in generation {membership.generation}")
    return rank
