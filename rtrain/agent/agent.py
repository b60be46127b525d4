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

import functools
import logging
import signal
import uuid
from collections.abc import Callable, Mapping

from ..core.clock import Clock
from ..core.config.component_specs import fault_part, monitor_part, observe_part, snapshot_part
from ..core.config.launch_spec import LaunchSpec
from ..core.config.worker_env import pool_environment
from ..core.errors import (
    ExitCode,
    JobFinished,
    RendezvousError,
    RtrainError,
    exit_code_for_signal,
)
from ..core.layout.topology import LayoutError
from ..core.rendezvous.decisions import Next, after_generation
from ..core.rendezvous.failures import FailureRecord
from ..core.rendezvous.place import Place
from ..core.rendezvous.protocol import Membership
from .ending import JobEnd
from .faults import FaultPolicy
from .generation import Generation, Joined, default_node_addr
from .health.gpu_monitor import GpuFault
from .health.guard import HealthGuard
from .kube.eviction import leave_job, leaves_on
from .kube.store_return import StoreReturn
from .monitor import GenerationMonitor
from .net.descriptors import DescriptorShortage, is_out_of_descriptors
from .observe.observer import Observer
from .rendezvous.job import JobRendezvous
from .rendezvous.job_end import JobAborted
from .rendezvous.lease import Leases
from .rendezvous.leases_for import open_leases
from .rendezvous.worker_store import GenerationEnded
from .repair.coordinator import RepairCoordinator
from .restart_backoff import RestartBackoff
from .runtime_dir import (
    make_run_log_dir,
    make_runtime_dir,
)
from .snapshots.service import SnapshotService
from .starter import GenerationStarter, Starts
from .state import AgentState, Interrupted, NodeFault, RunResult, SignalLatch
from .store.backends import JobStore, open_job_store
from .waiting import SYSTEM_CLOCK
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
        clock: Clock = SYSTEM_CLOCK,
        starter: Starts | None = None,
        open_store: Callable[[], JobStore] | None = None,
    ) -> None:
        """secret: the job secret (agent/snapshots/job_secret.py); None hands one out through
        the store. clock: every wait and duration of the agent's loop; starter, open_store:
        the generations' starter and the job's store (a unit test's fakes start no
        workers, and its store is FaultyStore: tests/unit/agent/test_agent_loop.py)."""
        self.spec = spec
        self._clock = clock
        self.nproc = nproc
        self.node_id = uuid.uuid4().hex
        self.addr = default_node_addr(spec)
        self.state = AgentState.INIT
        self.run_log_dir = make_run_log_dir(spec)
        self._observer = Observer(observe_part(spec), self.run_log_dir, self.addr, nproc, clock)
        self._base_env = dict(base_env)
        self._store_return = StoreReturn(spec, self._base_env)
        self._pool = WorkerPool(spec.preload, pool_environment(base_env, nproc))
        self._tail = LogTail()
        self._signals = SignalLatch()
        self._check_signal = self._signals.check
        self._gen: Generation | None = None
        self._health = health
        self._leases: Leases | None = None
        self._backoff = RestartBackoff(spec.faults.restart_backoff, clock)
        self._shortage = DescriptorShortage(clock)
        self._reaper = ZombieReaper(clock) if spec.faults.kill_process_tree else None
        # Heartbeat files and snapshot shards: memory-backed where possible.
        self._runtime = make_runtime_dir()
        self._runtime_dir = self._runtime.path
        self._snapshots = SnapshotService.for_launch(
            snapshot_part(spec), self._runtime_dir, self.addr, secret, clock
        )
        self._repair = RepairCoordinator.for_launch(
            spec, self._runtime_dir, self.run_log_dir, clock, self._snapshots.local.ceiling.lift
        )
        self._starter: Starts = starter or GenerationStarter(
            spec,
            self.node_id,
            self.addr,
            nproc,
            self._pool,
            self._tail,
            self._base_env,
            self.run_log_dir,
            self._runtime_dir,
            self._snapshots,
            clock,
        )
        self._open_store = open_store or self._open_job_store

    # -- the run --

    def run(self) -> RunResult:
        self._signals.install(self.spec.signals_to_handle)
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
            if self._leases is not None:
                self._leases.close()
            self._pool.close()
            self._tail.close()
            self._snapshots.close()
            if self._health is not None:
                self._health.close()
            self._runtime.close()
            self._observer.close()
            self._signals.restore()

    def _open_job_store(self) -> JobStore:
        spec = self.spec
        interrupt, node_rank = self._check_signal, spec.node_rank
        return open_job_store(spec.rdzv, spec.local_addr, interrupt, node_rank, self._clock)

    def _set_state(self, state: AgentState) -> None:
        if state != self.state:
            logger.debug("state %s -> %s", self.state.value, state.value)
            self.state = state

    def _run(self) -> RunResult:
        try:
            job_store = self._open_store()
        except RendezvousError as exc:
            return self._result(AgentState.FAILED, exc.exit_code, str(exc))
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            return self._result(
                AgentState.FAILED, exit_code_for_signal(exc.signum), f"stopped by {name}"
            )
        rdzv = JobRendezvous.over(job_store.kv, self.spec, self._clock)
        self._store_return.carry_over(rdzv)  # the store came back at the same name
        self._leases = leases = open_leases(job_store, rdzv.keys, self.spec.faults, self._clock)
        timeout = self.spec.rdzv.close_timeout
        end = JobEnd(rdzv, job_store.is_host, timeout, self._check_signal, self._clock)
        part = fault_part(self.spec)
        self._policy = FaultPolicy(rdzv, part, self.addr, self._check_signal, self._clock)
        self._monitor = GenerationMonitor(
            monitor_part(self.spec),
            self._check_signal,
            self._snapshots,
            self._observer,
            self._policy,
            leases,
            self._health,
            self._reaper,
            self._clock,
        )
        try:
            return self._generations(rdzv, end, leases)
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            if self.spec.slurm is not None and exc.signum in REQUEUE_SIGNALS:
                return self._save_for_requeue(end, f"received {name} from Slurm")
            if leaves_on(exc.signum, self.spec, self._base_env):  # a pod's eviction
                joined, hosts = self._starter.joined, job_store.is_host
                code, why = leave_job(rdzv, joined, self.addr, hosts, self._stop_group, self._clock)
                return self._result(AgentState.FAILED, code, why)
            logger.warning(
                "received %s; stopping workers (up to %gs)", name, self.spec.shutdown_timeout
            )
            self._stop_group(exc.signum, self.spec.shutdown_timeout)
            end.end_job(self._place(), ExitCode.TEMPFAIL, f"received {name}")
            return self._result(
                AgentState.FAILED, exit_code_for_signal(exc.signum), f"stopped by {name}"
            )
        except JobAborted as exc:
            if self.spec.slurm is not None and exc.record.exit_code == ExitCode.TEMPFAIL:
                return self._save_for_requeue(end, f"node {exc.record.node_rank} was told to stop")
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            failures = end.read_abort(self._place(), exc.record)
            message = f"job ended by node {exc.record.node_rank}: {exc.record.reason}"
            return self._result(AgentState.FAILED, exc.record.exit_code, message, failures)
        except JobFinished as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            logger.info("%s", exc)
            return self._result(AgentState.SUCCEEDED, ExitCode.SUCCESS, str(exc))
        except LayoutError as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            end.end_job(self._place(), ExitCode.LAYOUT, str(exc))
            return self._result(AgentState.FAILED, ExitCode.LAYOUT, str(exc))
        except RtrainError as exc:
            self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
            if self._store_return.waits_for(exc, job_store.is_host):  # its host's pod went
                last = self._starter.joined
                membership = last.membership if last is not None else None
                self._store_return.lost(membership, self._snapshots.secret)
                self._starter.joined = None
                leases.close()
                return self._run()
            message = end.explain(self._place(), exc, self.spec.nodes.min_nodes)
            return self._result(AgentState.FAILED, exc.exit_code, message)

    def _generations(self, rdzv: JobRendezvous, end: JobEnd, leases: Leases) -> RunResult:
        """One pass per generation; a node out of file descriptors restarts its part."""
        while True:
            try:
                result = self._generation(rdzv, end, leases)
            except OSError as exc:
                if not is_out_of_descriptors(exc):
                    raise
                self._out_of_descriptors(rdzv, exc)
                continue
            if result is not None:
                return result

    def _out_of_descriptors(self, rdzv: JobRendezvous, exc: OSError) -> None:
        """Logged, and this node's generation failed: the others restart with it."""
        joined = self._starter.joined
        generation = None if joined is None else joined.membership.generation
        self._shortage.ran_out(exc, generation)
        self._shortage.wait_for_spare(self.spec.rdzv.join_timeout, self._check_signal)
        self._stop_workers()
        if generation is not None:
            rdzv.rounds.open_next_round(generation)
        self._backoff.failed(self._check_signal)

    def _generation(self, rdzv: JobRendezvous, end: JobEnd, leases: Leases) -> RunResult | None:
        """Join, start, watch; then what core's decisions say (None: the next one)."""
        self._set_state(AgentState.RENDEZVOUS)
        rdzv.ledger.raise_if_excluded(self.addr)
        fault = self._health.before_join() if self._health is not None else None
        if fault is not None:
            return self._leave(rdzv, end, fault)
        previous = self._gen
        membership = self._join(rdzv)
        # The shard server binds this node's address, which under Kubernetes resolves
        # only once the job's pods are published: after a round closed, not before.
        # Once per store (again after a store return); a no-op after that.
        self._snapshots.start(rdzv)
        try:
            gen = self._starter.start(rdzv, membership, previous, self._policy, leases)
            # workers kept by a repair in place, if any, and every member's kept ranks
            self._repair.hand_over(gen, rdzv, lambda: self._policy.check_peers(gen))
        except GenerationEnded as exc:
            logger.info("%s (a member was lost while it started); rejoining", exc)
            return None
        self._gen = gen
        self._policy.settle(previous, gen)
        gen.group.start()
        self._observer.generation_started(
            gen.place,
            gen.topology.world_size,
            self._snapshots.restored_step,
            gen.group.warm_up_wait_s,
        )
        self._set_state(AgentState.HEALTHY)
        self._backoff.started()
        ended = self._monitor.watch(rdzv, gen)
        self._shortage.started()  # a whole generation ran with the descriptors it had
        last_step = self._snapshots.progress()[0]
        self._observer.generation_ended(gen.number, gen.beats(), ended.outcome, last_step)
        action = after_generation(ended.decision)
        if action is Next.FINISH:
            history = end.finish(gen.place, gen.peers)
            if history is not None:
                self._set_state(AgentState.SUCCEEDED)
                message = "all workers succeeded"
                return self._result(AgentState.SUCCEEDED, ExitCode.SUCCESS, message, history)
            logger.info("another node restarted the job after this node finished; rejoining")
            return None
        self._set_state(AgentState.UNHEALTHY)
        if action is Next.LEAVE:
            assert ended.fault is not None
            return self._leave(rdzv, end, ended.fault)
        rejoin = action is Next.REJOIN
        if rejoin:  # moved on, or ended to admit a node: the round says so before this
            rdzv.rounds.open_next_round(gen.number)  # node's workers stop under the others
        # A node whose own failure finds --max-restarts spent ends the job: no park.
        restarts_left = rejoin or not self._policy.budget.exhausted
        repaired = self._repair.park(gen, rdzv, ended.fault is not None, restarts_left)
        if not repaired:
            self._stop_workers()
        if rejoin:  # ours may have failed as the job moved on
            self._policy.record_failures(gen)
            self._backoff.healthy()
            return None
        gpu = ended.fault if isinstance(ended.fault, GpuFault) else None  # else it leaves
        give_up = self._policy.recover(gen, gpu, self._health, repaired)
        if give_up is not None:
            end.end_job(gen.place, give_up.exit_code, give_up.reason)
            return self._result(
                AgentState.FAILED, give_up.exit_code, give_up.reason, give_up.failures
            )
        # The round opens before the back-off: the others learn of the fault now (their
        # workers park at once, not after a broken collective's wait for a request).
        rdzv.rounds.open_next_round(gen.number)
        self._backoff.failed(self._check_signal)
        return None

    def _join(self, rdzv: JobRendezvous) -> Membership:
        last = self._starter.joined
        member = Joined.member(self.node_id, self.addr, self.nproc, self.spec.node_rank, last)
        return rdzv.rounds.join(
            member,
            check_stop=self._check_signal,
            expected=self._policy.survivors(last),
            last_seen=self._policy.last_seen(last),
            on_standby=functools.partial(
                self._repair.stand_by, self._pool, self.nproc, self._starter.spare_spawner
            ),
        )

    def _stop_workers(self) -> None:
        self._stop_group(signal.SIGTERM, RESTART_STOP_GRACE_S)
        if self.spec.faults.kill_process_tree:
            kill_leftovers(keep=self._pool.pids)

    def _save_for_requeue(self, end: JobEnd, why: str) -> RunResult:
        """Slurm is about to stop the job (time limit, preemption): stop the workers,
        write their newest snapshots to --checkpoint-dir, and exit 75 so that the batch
        script (or RequeueExit=75) requeues it; the requeued job restores from disk."""
        self._stop_group(signal.SIGTERM, self.spec.shutdown_timeout)
        directory, save = self.spec.snapshots.checkpoint_dir, self._snapshots.save_to_disk
        why = end.save_for_requeue(self._place(), why, directory, save)
        return self._result(AgentState.FAILED, ExitCode.TEMPFAIL, f"{why}; requeue to go on")

    def _leave(self, rdzv: JobRendezvous, end: JobEnd, fault: GpuFault | NodeFault) -> RunResult:
        """Leave the job for a fault of this node's own (a GPU's, a lasting straggler's):
        tell the others first (they put their workers' failures down to this node), then
        stop the workers."""
        last = self._starter.joined
        place = last.place if last is not None else None
        stop = functools.partial(self._stop_group, signal.SIGTERM, RESTART_STOP_GRACE_S)
        timeout = self.spec.rdzv.join_timeout
        record = end.leave_for_fault(self._health, fault, place, self.addr, stop, timeout)
        message = f"this node left the job: {fault.describe()}"
        return self._result(AgentState.FAILED, ExitCode.NODE_UNHEALTHY, message, [record])

    def _place(self) -> Place | None:
        """This node's place in its last generation, if it started one."""
        return self._gen.place if self._gen is not None else None

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
        self._observer.job_ended(int(code), message)
        generation = self._gen.number if self._gen is not None else 0
        return RunResult.ended(state, code, message, self.run_log_dir, generation, failures)
