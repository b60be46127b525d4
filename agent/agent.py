"""The per-node agent: an explicit state machine over rendezvous, workers and failures.

  INIT -> RENDEZVOUS -> HEALTHY -> SUCCEEDED
                 ^          |
                 |          v
                 +------ UNHEALTHY -> FAILED

Each pass through RENDEZVOUS is a new generation with a fresh worker store, so no
state of an earlier generation can reach a later one. While HEALTHY the agent watches
its workers (exits, heartbeats), its peers' leases, and the round counter: a round
that moved past this generation fences the node, which stops its workers and rejoins.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Mapping
from types import FrameType
from typing import Any

from ..core.config.launch_spec import LaunchSpec
from ..core.config.worker_env import pool_environment
from ..core.errors import ExitCode, RendezvousError, RtrainError, exit_code_for_signal
from ..core.layout.topology import LayoutError
from ..core.rendezvous.failures import FailureRecord, root_cause_first
from ..core.rendezvous.protocol import MemberInfo, Membership, StoreKeys
from . import log
from .faults import FaultPolicy, kill_hung
from .generation import (
    Generation,
    default_node_addr,
    generation_topology,
    membership_rank,
    previous_grid,
    write_topology,
)
from .health.gpu_monitor import GpuFault
from .health.guard import HealthGuard
from .recycle_plans import plan_generation
from .rendezvous.job_end import JobEnd
from .rendezvous.lease import LeaseKeeper, PeerLeases
from .rendezvous.rounds import GenerationEnded, JobAborted, StoreRendezvous
from .restart_backoff import RestartBackoff
from .runtime_dir import (
    make_folder,
    make_run_log_dir,
    make_runtime_dir,
    write_failure_report,
)
from .snapshots.service import SnapshotService
from .state import AgentState, Interrupted, Outcome, RunResult
from .store.opening import connect_store, host_store, open_rendezvous_store
from .workers.group import WorkerGroup
from .workers.hang_watch import HangWatch
from .workers.log_tail import LogTail
from .workers.pool import WorkerPool
from .workers.process_tree import ZombieReaper, become_subreaper, kill_leftovers

logger = logging.getLogger(__name__)

# Under Slurm these mean "the job is about to be stopped" (--signal=USR1@T, the time
# limit's SIGTERM): save and exit 75 to be requeued.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# Workers of a failed generation get this long after SIGTERM before SIGKILL.
RESTART_STOP_GRACE_S = 3.0


class Agent:
    def __init__(
        self,
        spec: LaunchSpec,
        base_env: Mapping[str, str],
        nproc: int,
        health: HealthGuard | None = None,
        secret: bytes | None = None,
    ) -> None:
        """secret: the job secret (agent/snapshots/job_secret.py); None hands one out through
        the store."""
        self.spec = spec
        self.nproc = nproc
        self.node_id = uuid.uuid4().hex
        self.addr = default_node_addr(spec)
        self.state = AgentState.INIT
        self.run_log_dir = make_run_log_dir(spec)
        self._base_env = dict(base_env)
        self._pool = WorkerPool(spec.preload, pool_environment(base_env, nproc))
        self._tail = LogTail()
        self._signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._gen: Generation | None = None
        self._health = health
        self._fault: GpuFault | None = None  # what ended the last generation, if a GPU
        # The last generation this node joined (even one that ended before it started):
        # its membership, this node's rank in it, and the peers' leases.
        self._last: tuple[Membership, int, PeerLeases] | None = None
        self._lease: LeaseKeeper | None = None
        self._worker_store: Any = None
        self._backoff = RestartBackoff(spec.faults.restart_backoff)
        self._reaper = ZombieReaper() if spec.faults.kill_process_tree else None
        # Heartbeat files and snapshot shards: memory-backed where possible.
        self._runtime = make_runtime_dir()
        self._runtime_dir = self._runtime.path
        self._snapshots = SnapshotService.for_launch(spec, self._runtime_dir, self.addr, secret)

    # -- signals --

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signal = signum

    def _check_signal(self) -> None:
        if self._signal is not None:
            raise Interrupted(self._signal)

    # -- the run --

    def run(self) -> RunResult:
        for signum in self.spec.signals_to_handle:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        if self.spec.faults.kill_process_tree and not become_subreaper():
            logger.warning("--kill-process-tree: this system has no child subreaper; ignored")
        self._pool.start()
        try:
            return self._run()
        finally:
            self._stop_group(signal.SIGKILL, 1.0)
            if self.spec.faults.kill_process_tree:
                self._pool.close()
                kill_leftovers(keep=())
            if self._lease is not None:
                self._lease.close()
            self._pool.close()
            self._tail.close()
            self._snapshots.close()
            if self._health is not None:
                self._health.close()
            self._runtime.close()
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
        self._lease = LeaseKeeper(
            lambda: connect_store(rdzv_spec.host, opened.port, 10.0, rdzv_spec.read_timeout).store,
            StoreKeys(rdzv_spec.run_id),
            self.spec.faults.heartbeat_interval,
        )
        end = JobEnd(rdzv, opened.is_host, rdzv_spec.close_timeout, self._check_signal)
        self._policy = FaultPolicy(rdzv, self.spec, self.addr, self._check_signal)
        try:
            return self._generations(rdzv, end)
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            if self.spec.slurm is not None and exc.signum in REQUEUE_SIGNALS:
                return self._save_for_requeue(end, f"received {name} from Slurm")
            logger.warning(
                "received %s; stopping workers (up to %gs)", name, self.spec.shutdown_timeout
            )
            self._stop_group(exc.signum, self.spec.shutdown_timeout)
            end.end_job(self._gen, ExitCode.TEMPFAIL, f"received {name}")
            return self._result(
                AgentState.FAILED, exit_code_for_signal(exc.signum), f"stopped by {name}"
            )
        except JobAborted as exc:
            if self.spec.slurm is not None and exc.record.exit_code == ExitCode.TEMPFAIL:
                return self._save_for_requeue(end, f"node {exc.record.node_rank} was told to stop")
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            failures = end.read_abort(self._gen, exc.record)
            message = f"job ended by node {exc.record.node_rank}: {exc.record.reason}"
            return self._result(AgentState.FAILED, exc.record.exit_code, message, failures)
        except LayoutError as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            end.end_job(self._gen, ExitCode.LAYOUT, str(exc))
            return self._result(AgentState.FAILED, ExitCode.LAYOUT, str(exc))
        except RtrainError as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            message = end.explain(self._gen, exc, self.spec.nodes.min_nodes)
            return self._result(AgentState.FAILED, exc.exit_code, message)

    def _generations(self, rdzv: StoreRendezvous, end: JobEnd) -> RunResult:
        while True:
            self._set_state(AgentState.RENDEZVOUS)
            rdzv.raise_if_excluded(self.addr)
            fault = self._health.before_join() if self._health is not None else None
            if fault is not None:
                return self._leave(rdzv, end, fault)
            previous = self._gen
            member = MemberInfo(
                node_id=self.node_id,
                addr=self.addr,
                local_world_size=self.nproc,
                requested_rank=self.spec.node_rank,
                prev_rank=self._last[1] if self._last is not None else None,
            )
            membership = rdzv.join(
                member, check_stop=self._check_signal, expected=self._policy.survivors(self._last)
            )
            try:
                gen = self._start_generation(rdzv, membership, previous)
            except GenerationEnded as exc:
                logger.info("%s (a member was lost while it started); rejoining", exc)
                continue
            self._set_state(AgentState.HEALTHY)
            self._backoff.started()
            outcome = self._monitor(rdzv, gen)
            if outcome is Outcome.SUCCEEDED:
                # One node reports what the job recovered from, not every node; read it
                # before the barrier, after which the store's host may leave.
                history = rdzv.history(gen.number) if gen.node_rank == 0 else []
                if end.exit_barrier(membership):
                    self._set_state(AgentState.SUCCEEDED)
                    return self._result(
                        AgentState.SUCCEEDED, ExitCode.SUCCESS, "all workers succeeded", history
                    )
                logger.info("another node restarted the job after this node finished; rejoining")
                continue
            self._set_state(AgentState.UNHEALTHY)
            fault, self._fault = self._fault, None
            if fault is not None and fault.action.excludes_node:
                return self._leave(rdzv, end, fault)
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            if self.spec.faults.kill_process_tree:
                kill_leftovers(keep=self._pool.pids)
            if outcome is Outcome.MEMBERSHIP_CHANGE:  # ours may have failed as it moved on
                self._policy.record_failures(gen)
            if outcome in (Outcome.LOCAL_FAILURE, Outcome.GPU_FAULT):
                restart_for = None
                if fault is not None and self._health is not None:
                    logger.warning("restarting the workers: %s", fault.describe())
                    restart_for = [self._health.record(fault, gen.number, gen.node_rank, self.addr)]
                give_up = self._policy.after_local_failure(gen, restart_for)
                if give_up is not None:
                    end.end_job(gen, give_up.exit_code, give_up.reason)
                    return self._result(
                        AgentState.FAILED, give_up.exit_code, give_up.reason, give_up.failures
                    )
                self._backoff.failed(self._check_signal)
            else:
                self._backoff.healthy()
            rdzv.open_next_round(gen.number)

    def _start_generation(
        self, rdzv: StoreRendezvous, membership: Membership, previous: Generation | None
    ) -> Generation:
        generation = membership.generation
        log.set_generation(generation)
        node_rank = membership_rank(membership, self.node_id)
        log.set_node(f"node{node_rank}")
        peers = PeerLeases(
            rdzv.call,
            StoreKeys(self.spec.rdzv.run_id),
            generation,
            [n for n in range(len(membership.members)) if n != node_rank],
            self.spec.faults.heartbeat_timeout,
            self.spec.faults.heartbeat_interval,
        )
        self._last = (membership, node_rank, peers)

        def watch() -> bool:  # a member lost while the generation starts ends it
            return self._policy.check_leases(membership, node_rank, peers)

        assert self._lease is not None
        self._lease.hold(generation, node_rank)
        before = previous_grid(rdzv, self.spec.layout, membership, previous)
        topology = generation_topology(self.spec.layout, membership, before)
        logger.info("generation %d layout: %s", generation, topology.summary())
        self._worker_store = None  # the previous generation's store closes here
        if node_rank == 0:
            opened = host_store(self.addr, 0, self.spec.rdzv.read_timeout)
            self._worker_store = opened.store
            rdzv.publish_master(generation, self.addr, opened.port)
            master = (self.addr, opened.port)
        else:
            master = rdzv.wait_master(generation, self.spec.rdzv.join_timeout, watch)
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
        folder, topology_env = write_topology(self.run_log_dir, topology)
        plan_env, plan = plan_generation(rdzv, self.spec, folder, topology, before, previous)
        snapshot_env = self._snapshots.prepare(
            rdzv, membership, topology, node_rank, self.nproc, self.spec.rdzv.join_timeout, watch
        )
        beat_dir = os.path.join(self._runtime_dir, f"gen{generation}")
        make_folder(beat_dir, "this generation's heartbeat files")
        hangs = HangWatch(self.spec.faults.hang_timeout, beat_dir)

        def extra_env(local_rank: int, log_dir: str) -> dict[str, str]:
            return {
                **topology_env,
                **plan_env,
                **snapshot_env,
                **hangs.worker_env(local_rank, log_dir),
            }

        self._pool.ensure_running()
        group = WorkerGroup(
            self._pool,
            self.spec,
            assignment,
            self.run_log_dir,
            self._base_env,
            self._tail,
            extra_env,
        )
        self._gen = Generation(membership, node_rank, group, peers, hangs, topology, plan)
        self._policy.settle(previous, self._gen)
        group.start()
        return self._gen

    def _monitor(self, rdzv: StoreRendezvous, gen: Generation) -> Outcome:
        group, generation = gen.group, gen.number
        room_to_grow = len(gen.membership.members) < self.spec.nodes.max_nodes
        while True:
            self._check_signal()
            group.poll(self.spec.monitor_interval)
            # A signal for the whole step (Slurm's) reaches the workers too: act on it
            # before their deaths look like a failure.
            self._check_signal()
            if rdzv.round_moved_past(generation):
                self._policy.log_fenced(gen)
                return Outcome.MEMBERSHIP_CHANGE
            hung = gen.hangs.hung([w.local_rank for w in group.running])
            if hung:
                kill_hung(group, gen.hangs, hung)
            if group.failed:
                return Outcome.LOCAL_FAILURE
            self._fault = self._health.poll() if self._health is not None else None
            if self._fault is not None:
                return Outcome.GPU_FAULT
            if group.succeeded:
                return Outcome.SUCCEEDED
            if self._reaper is not None:
                self._reaper.poll()
            rdzv.raise_if_aborted()
            if self._policy.check_peers(gen):
                return Outcome.MEMBERSHIP_CHANGE
            if room_to_grow and rdzv.waiting_nodes(generation) > 0:
                logger.info("a new node is waiting to join; restarting to admit it")
                return Outcome.MEMBERSHIP_CHANGE

    def _save_for_requeue(self, end: JobEnd, why: str) -> RunResult:
        """Slurm is about to stop the job (time limit, preemption): stop the workers,
        write their newest snapshots to --checkpoint-dir, and exit 75 so that the batch
        script (or RequeueExit=75) requeues it; the requeued job restores from disk."""
        self._stop_group(signal.SIGTERM, self.spec.shutdown_timeout)
        directory = self.spec.snapshots.checkpoint_dir
        try:
            step = self._snapshots.save_to_disk()
        except OSError as exc:
            step, why = None, f"{why}; saving to {directory} failed: {exc}"
        if step is not None:
            why = f"{why}; saved step {step} to {directory}"
        elif not directory:
            why = f"{why}; nothing saved (no --checkpoint-dir)"
        logger.warning("%s; exiting %d to be requeued", why, ExitCode.TEMPFAIL)
        end.end_job(self._gen, ExitCode.TEMPFAIL, why)
        return self._result(AgentState.FAILED, ExitCode.TEMPFAIL, f"{why}; requeue to go on")

    def _leave(self, rdzv: StoreRendezvous, end: JobEnd, fault: GpuFault) -> RunResult:
        """Leave the job for a GPU fault: tell the others first (so that they put their
        workers' failures down to this node), then stop the workers."""
        assert self._health is not None
        generation, node_rank = (
            (self._last[0].generation, self._last[1]) if self._last else (0, None)
        )
        record = self._health.leave_job(rdzv, fault, generation, node_rank, self.addr)
        self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
        end.host_until_done(self.spec.rdzv.join_timeout)
        message = f"this node left the job: {fault.describe()}"
        return self._result(AgentState.FAILED, ExitCode.NODE_UNHEALTHY, message, [record])

    def _stop_group(self, sig: int, timeout: float) -> None:
        if self._gen is not None:
            self._gen.group.stop(sig, timeout)

    def _result(
        self,
        state: AgentState,
        code: int,
        message: str,
        failures: list[FailureRecord] | None = None,
    ) -> RunResult:
        ordered = root_cause_first(failures or [])
        if ordered:
            write_failure_report(self.run_log_dir, ordered)
        return RunResult(
            state=state,
            exit_code=int(code),
            message=message,
            run_log_dir=self.run_log_dir,
            generation=self._gen.number if self._gen is not None else 0,
            failures=ordered,
        )
