"""WorkerGroup: this node's workers of one generation, started from the pool and supervised."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ...core.clock import Clock, wait_until
from ...core.config.launch_spec import LaunchSpec
from ...core.config.worker_env import (
    STDERR,
    STDOUT,
    NodeAssignment,
    attempt_dir,
    import_time_differences,
    import_time_names_set,
    stream_plan,
    tee_prefix,
    worker_environment,
)
from ...core.observe.through import ThroughNote
from ...core.rendezvous.failures import FailureRecord
from ..launch.preflight import gpu_count
from ..waiting import SYSTEM_CLOCK
from .boot import fresh_interpreter
from .hang_watch import STOPPED_STATES, HangFinding, HangWatch, inspect_hang, process_state
from .log_tail import LogTail
from .pool import PoolDied, WorkerPool
from .records import Worker, failure_record, stopped_clean

logger = logging.getLogger(__name__)

KILL_WAIT_S = 5.0
WARM_WAIT_LINE_S = 0.5  # a start that waited this long for the warm-up says so


# Starts warm spare `slot` (its log folder, variables to set or, as None, to drop): pid.
SpareSpawner = Callable[[int, str, Mapping[str, "str | None"]], int]


class RepairSeam(Protocol):
    """Repair in place (agent/repair/handover.py) as a group meets it, its one seam: the
    variables every worker gets, a worker kept from the last generation handed this
    one's environment instead of a spawn, a kept process that did not resume (ended
    before its replacement starts), and a silent worker spared for the repair."""

    def env(self, local_rank: int) -> Mapping[str, str]: ...

    def resume(self, local_rank: int, env: Mapping[str, str]) -> int | None: ...

    def stale(self, local_rank: int) -> int | None: ...

    def spares(self, worker: Worker, finding: HangFinding, silent_s: float) -> bool: ...

    def observe(self, workers: Sequence[Worker]) -> ThroughNote | None: ...

    def take_spare(self, local_rank: int, env: Mapping[str, str]) -> int | None: ...

    def fill_spares(self, spawn: SpareSpawner) -> None: ...


class WorkerGroup:
    def __init__(
        self,
        pool: WorkerPool,
        spec: LaunchSpec,
        assignment: NodeAssignment,
        run_log_dir: str,
        base_env: Mapping[str, str],
        tail: LogTail,
        extra_env: Callable[[int, str], Mapping[str, str]] | None = None,
        hangs: HangWatch | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """clock: the waits for exits (their sleep is polling the pool: a fake pool's
        poll moves a fake clock) and the wall-clock times of a stop and a kill."""
        self._pool = pool
        self._clock = clock
        self._hangs = hangs
        self._extra_env = extra_env
        self._spec = spec
        self.assignment = assignment
        self._run_log_dir = run_log_dir
        self._base_env = base_env
        self._tail = tail
        self._stopping = False
        self._warned_fresh = False
        self._stop_time = float("inf")  # wall clock when stop() began
        self.workers: list[Worker] = []
        self.handover: RepairSeam | None = None
        self._exited_pids: set[int] = set()  # every exit the pool reported, the group's or not
        self.warm_up_wait_s = 0.0  # of start(): the spawns' wait for the pool's warm-up

    def start(self) -> None:
        spec, a = self._spec, self.assignment
        kept_alive = 0  # workers a repair in place handed over, not started
        taken = 0  # warm spares that took a rank
        for local_rank in range(a.local_world_size):
            log_dir = attempt_dir(self._run_log_dir, a.generation, local_rank)
            os.makedirs(log_dir, exist_ok=True)
            worker = Worker(
                local_rank, a.global_rank(local_rank), log_dir, os.path.join(log_dir, "error.json")
            )
            env = worker_environment(
                spec, a, local_rank, worker.error_file, self._base_env, node_has_gpus()
            )
            if self._extra_env is not None:
                env.update(self._extra_env(local_rank, log_dir))
            if self.handover is not None:
                env.update(self.handover.env(local_rank))
                kept = self.handover.resume(local_rank, env)
                if kept is not None:  # its output still goes to the files it started with
                    worker.pid, kept_alive = kept, kept_alive + 1
                    self.workers.append(worker)
                    continue
                stale = self.handover.stale(local_rank)
                if stale is not None:
                    self._end_stale(worker.worker_id, stale)
                spare = self.handover.take_spare(local_rank, env)
                if spare is not None:  # a warm spare takes the rank; its output stays its own
                    self._pool.rename(spare, worker.worker_id)
                    worker.pid, taken = spare, taken + 1
                    self.workers.append(worker)
                    continue
            prefix = tee_prefix(spec.role, worker.rank)
            worker.pid = self._spawn(worker.worker_id, env, log_dir, local_rank, prefix)
            self.workers.append(worker)
        self._pool.drop_spares()
        if self.handover is not None:  # after the workers: they go first on a busy node
            self.handover.fill_spares(self.spare_spawner())
        self.warm_up_wait_s = self._pool.take_warm_wait()
        if self.warm_up_wait_s >= WARM_WAIT_LINE_S:
            logger.info(
                "the workers' start waited %.1fs for the pool's warm-up imports to end",
                self.warm_up_wait_s,
            )
        logger.info(
            "started %s (ranks %d-%d of %d)",
            started_line(len(self.workers) - kept_alive - taken, kept_alive, taken),
            a.rank_offset,
            a.rank_offset + a.local_world_size - 1,
            a.world_size,
        )

    def _spawn(
        self, worker_id: str, env: Mapping[str, str], log_dir: str, local_rank: int, prefix: str
    ) -> int:
        """Start one worker (or spare) from the pool, its streams as the flags say; its pid."""
        plan = stream_plan(self._spec, local_rank)
        stdout_file = os.path.join(log_dir, "stdout.log") if plan.redirect & STDOUT else None
        stderr_file = os.path.join(log_dir, "stderr.log") if plan.redirect & STDERR else None
        if stdout_file and plan.tee & STDOUT:
            self._tail.add(stdout_file, prefix, sys.stdout)
        if stderr_file and plan.tee & STDERR:
            self._tail.add(stderr_file, prefix, sys.stderr)
        return self._pool.spawn(
            {
                "id": worker_id,
                **self._entry(env),
                "env": dict(env),
                "cwd": os.getcwd(),
                "stdout_file": stdout_file,
                "stderr_file": stderr_file,
            },
            # as long as the generation's rendezvous may take: a loaded node is slow
            timeout=self._spec.rdzv.join_timeout,
        )

    def spare_spawner(self) -> SpareSpawner:
        """How a warm spare of slot s starts: as a worker of local rank (local world + s),
        into log_dir, with `env` over that worker's variables."""
        a = self.assignment

        def spawn(slot: int, log_dir: str, overrides: Mapping[str, str | None]) -> int:
            local_rank = a.local_world_size + slot
            error_file = os.path.join(log_dir, "error.json")
            env = worker_environment(
                self._spec, a, local_rank, error_file, self._base_env, node_has_gpus()
            )
            env.update({k: v for k, v in overrides.items() if v is not None})
            for name in [k for k, v in overrides.items() if v is None]:
                env.pop(name, None)
            return self._spawn(f"spare{slot}", env, log_dir, local_rank, f"[spare{slot}]:")

        return spawn

    def _end_stale(self, worker_id: str, pid: int) -> None:
        """SIGKILL a kept process that will not resume and wait for its exit, before its
        replacement (of the same worker id) is spawned: a stopped one continued later
        must never train beside it."""
        self._pool.signal(worker_id, signal.SIGKILL)
        if not self._wait_exits(lambda: pid in self._exited_pids, KILL_WAIT_S):
            logger.warning("kept worker pid %d not reaped %gs after SIGKILL", pid, KILL_WAIT_S)

    def _entry(self, env: Mapping[str, str]) -> dict[str, object]:
        """How the worker runs the entrypoint: forked from the pool, or as a fresh
        interpreter (--start-method spawn, or the pool's torch was imported under other
        import-time settings)."""
        entry = self._spec.entrypoint
        request: dict[str, object] = {
            "kind": entry.kind,
            "target": entry.target,
            "args": list(entry.args),
        }
        if self._spec.fresh_workers:
            return fresh_interpreter(request)
        if entry.kind == "exec":
            return request
        differences = import_time_differences(self._pool.env, env)
        set_by_script = script_sets_import_time(entry.kind, entry.target)
        if not differences and not set_by_script:
            return request
        if not self._warned_fresh:  # the same for every worker of the group: say it once
            self._warned_fresh = True
            why = (
                f"{', '.join(differences)} differ{'s' if len(differences) == 1 else ''} "
                "from the pool's"
                if differences
                else f"the script sets {', '.join(set_by_script)} itself"
            )
            logger.warning(
                "starting workers as fresh interpreters, without the preloaded pool: "
                "%s, and torch reads such variables at import",
                why,
            )
        return fresh_interpreter(request)

    def poll(self, timeout: float) -> None:
        """Take the exits reported within `timeout` (the wait for the first)."""
        try:
            exits = self._pool.poll_exits(timeout)
        except PoolDied:
            exits = []
            self._mark_all_lost()
        # by pid: a warm spare that took a rank may exit before the pool hears its new id
        by_pid = {w.pid: w for w in self.workers}
        for event in exits:
            worker = by_pid.get(event.pid)
            if worker is not None and worker.exitcode is None:
                worker.exitcode = event.exitcode
                worker.exit_time = event.time
                # Reaped before the stop began: it failed on its own, even if its report
                # arrived late (a loaded machine); it may be the root cause.
                worker.stopped_by_agent = self._stopping and event.time >= self._stop_time
        self._exited_pids.update(event.pid for event in exits)

    def _mark_all_lost(self) -> None:
        for worker in self.workers:
            if worker.exitcode is None:
                worker.exitcode = -int(signal.SIGKILL)
                worker.exit_time = self._clock.wall()
                worker.stopped_by_agent = self._stopping

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.exitcode is None]

    @property
    def failed(self) -> list[Worker]:
        return [
            w
            for w in self.workers
            if w.exitcode not in (None, 0)
            and not w.left_out
            and not (w.stopped_by_agent and stopped_clean(w, self._stop_time))
        ]

    @property
    def succeeded(self) -> bool:
        return bool(self.workers) and all(w.exitcode == 0 for w in self.workers)

    def kill_hung(self, worker: Worker, finding: HangFinding) -> None:
        """SIGKILL one hung worker (SIGTERM would stay pending on a stopped process);
        not a victim a repair in place will free (RepairSeam.spares)."""
        if self.handover is not None and self._hangs is not None:
            silent = self._hangs.silent_for(worker.local_rank)
            if self.handover.spares(worker, finding, silent):
                return
        logger.warning("worker rank %d %s; stack:\n%s", worker.rank, finding.message, finding.stack)
        worker.hang = finding
        self._pool.signal(worker.worker_id, signal.SIGKILL)
        self._wait_exits(lambda: worker.exitcode is not None, KILL_WAIT_S)
        self._killed([worker])

    def prefork(self, local_ranks: list[int]) -> None:
        """Have the pool fork these local ranks' next workers now (a repair in place's
        replacements, forked while the survivors park); the next start hands them their
        requests."""
        for local_rank in local_ranks:
            self._pool.prefork(str(local_rank))

    def leave_out(self, local_ranks: list[int]) -> None:
        """SIGKILL these workers (a repair in place went on without them) and wait for
        their exits; the other workers run on."""
        chosen = [w for w in self.running if w.local_rank in local_ranks]
        for worker in chosen:
            worker.left_out = True
            self._pool.signal(worker.worker_id, signal.SIGKILL)
        self._wait_exits(lambda: all(w.exitcode is not None for w in chosen), KILL_WAIT_S)
        self._killed(chosen)

    def _killed(self, workers: list[Worker]) -> None:
        """Those of `workers` whose exit did not come after their SIGKILL: killed now."""
        for worker in workers:
            if worker.exitcode is None:
                worker.exitcode, worker.exit_time = -int(signal.SIGKILL), self._clock.wall()

    def stop(self, sig: int, timeout: float) -> None:
        """Send `sig` to every worker, wait up to `timeout`, then SIGKILL what is left.
        A held worker (stopped, or stuck in D) is killed at once: it cannot act on `sig`."""
        if not self._stopping:
            self._kill_held()
            self._stopping, self._stop_time = True, self._clock.wall()
        if self.running:
            self._pool.signal_all(sig)
            self._wait_all(timeout)
        if self.running:
            logger.warning(
                "%d workers ignored %s; killing them", len(self.running), signal.Signals(sig).name
            )
            self._pool.signal_all(signal.SIGKILL)
            self._wait_all(KILL_WAIT_S)
        if self.running:
            self._mark_all_lost()
        self._tail.flush_and_reset()

    def _kill_held(self) -> None:
        """SIGKILL each worker whose process is held, and record it hung (before the stop
        begins, so its death is a failure of its own): the job moved on before this
        node's hang check fired, and it may be what the others were waiting for."""
        for worker in self.running:
            state = process_state(worker.pid)
            if self._hangs is not None and self._hangs.still_held(worker.local_rank, state):
                found = inspect_hang(
                    self._hangs, worker.local_rank, worker.pid, worker.error_file, ending=True
                )
                self.kill_hung(worker, found)
            elif state in STOPPED_STATES:
                self._pool.signal(worker.worker_id, signal.SIGKILL)

    def _wait_all(self, timeout: float) -> None:
        self._wait_exits(lambda: not self.running, timeout)

    def _wait_exits(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait for exits: polling the pool for one is the sleep."""
        return wait_until(predicate, timeout, 0.05, self._clock.now, self.poll)

    def failure_records(self, host: str) -> list[FailureRecord]:
        """The workers that failed on their own (what the store records and charges)."""
        return [failure_record(worker, self.assignment, host) for worker in self.failed]

    def stopped_records(self, host: str) -> list[FailureRecord]:
        """The workers the agent stopped that ended non-zero (for the final report)."""
        failed = {id(w) for w in self.failed}
        return [
            failure_record(w, self.assignment, host, stopped=True)
            for w in self.workers
            if w.exitcode not in (None, 0) and id(w) not in failed
        ]


@functools.cache
def script_sets_import_time(kind: str, target: str) -> list[str]:
    """The import-time variables (OMP_NUM_THREADS, MKL_NUM_THREADS, ...) a script file
    sets for itself (core/config/worker_env.py's import_time_names_set): such a script
    starts as a fresh interpreter, as under torchrun, not forked from the pool whose
    torch read them already. Read once per script and path; a module entry point is not
    read (its file is known only once imported)."""
    if kind != "script":
        return []
    try:
        with open(target, encoding="utf-8", errors="replace") as handle:
            return import_time_names_set(handle.read(1 << 22))
    except OSError:
        return []


@functools.cache
def node_has_gpus() -> bool:
    """Whether workers here use NCCL, as far as the agent can tell without CUDA: GPUs
    visible (torch's flight recorder is turned on for them, core/config/worker_env.py)."""
    return gpu_count() > 0


def started_line(started: int, kept: int, spares: int = 0) -> str:
    """What a generation's start did: '2 workers', or '1 worker, kept 1 alive by the
    repair in place' where a repair in place handed workers over instead (and ', 1 warm
    spare took a rank' where spares did)."""
    line = f"{started} worker{'' if started == 1 else 's'}"
    line = line if not kept else f"{line}, kept {kept} alive by the repair in place"
    took = "spare took a rank" if spares == 1 else "spares took ranks"
    return line if not spares else f"{line}, {spares} warm {took}"
