"""`rtrain launch`'s start-up, without the command line: from the flags' raw values
(cli/launch_args.py) and the environment to the agent's RunResult.

launch() resolves Slurm's part, builds and checks the spec, reads the job secret, then
(unless a dry run) sets up logging, says what the user should know, opens the GPU health
guard and runs the Agent. Errors the user can fix come back as the outcome's RtrainError;
the caller (cli/main.py) only renders the outcome and says the notes as they come.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.config.launch_spec import LaunchSpec, build_launch_spec
from ...core.config.slurm.env import apply_slurm, read_slurm_job
from ...core.config.worker_env import omp_threads_default
from ...core.errors import ExitCode, RtrainError, UsageError
from ..health.nvml_reader import nvml_missing
from ..kube.shm import check_shm
from ..net.probe import state_choice
from ..observe import log
from ..snapshots.job_secret import STORE_FALLBACK_WARNING, JobSecret, read_job_secret
from ..state import AgentState, RunResult
from ..store.opening import listens_beyond_loopback
from ..store.store_host import HostChoice, choose_store_host
from .preflight import preflight
from .slurm import resolve_node_address

if TYPE_CHECKING:
    from ..agent import Agent

logger = logging.getLogger(__name__)

# A line for the user on stderr, said at once (before the agent's own lines); the
# caller puts "rtrain: " in front of it.
Notify = Callable[[str], None]

OMP_NOTE = (
    "OMP_NUM_THREADS is unset; setting it to 1 for each worker (tune it for your application)"
)


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch resolved before anything starts: the spec, this node's number of
    workers, what was taken from Slurm (one phrase each), and the job secret."""

    spec: LaunchSpec
    nproc: int
    secret: JobSecret
    took: list[str] = field(default_factory=list)
    dry_run: bool = False
    log_format: str = "text"


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended: an error (nothing may have started), a dry run's plan and its
    store host (None over etcd: no node hosts it), or the agent's RunResult."""

    plan: LaunchPlan | None = None
    error: RtrainError | None = None
    store_host: HostChoice | None = None
    result: RunResult | None = None
    no_gpu_checks: str | None = None  # a dry run: why this node will run no GPU checks
    state_net: str = ""  # a dry run: the interface replicas and restores will use

    @property
    def succeeded(self) -> bool:
        return self.result is not None and self.result.state is AgentState.SUCCEEDED

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        return self.result.exit_code if self.result is not None else ExitCode.SUCCESS


def launch(raw: dict[str, Any], environ: Mapping[str, str], notify: Notify) -> LaunchOutcome:
    """Run this node's part of the job the flags describe (the workers inherit environ)."""
    base_env = dict(environ)
    try:
        plan = plan_launch(raw, environ)
    except RtrainError as exc:
        return LaunchOutcome(error=exc)
    if plan.dry_run:
        try:
            off = nvml_missing(environ) if plan.spec.health.interval > 0 else None
        except RtrainError as exc:  # a malformed fake-NVML scenario
            return LaunchOutcome(plan, error=exc)
        net = state_choice(plan.spec.local_addr or socket.gethostname()).describe()
        return LaunchOutcome(
            plan, store_host=store_host(plan.spec), no_gpu_checks=off, state_net=net
        )
    prepare(plan, environ, notify)
    try:
        agent = open_agent(plan, base_env, environ)
    except RtrainError as exc:
        return LaunchOutcome(plan, error=exc)
    return LaunchOutcome(plan, result=agent.run())


def plan_launch(raw: dict[str, Any], environ: Mapping[str, str]) -> LaunchPlan:
    """Slurm's values where no flag was given, the spec, its preflight and the job
    secret; a RtrainError for what the user must fix."""
    raw = dict(raw)
    took: list[str] = []
    job = read_slurm_job(environ)
    if job is not None:
        names = {job.head, job.nodes[job.node_id]}
        addresses = {name: resolve_node_address(name) for name in names}
        raw, took = apply_slurm(raw, raw["explicit"], job, addresses)
        raw["slurm"] = job
    if raw.get("recycle_profile"):
        raw["recycle_profile_data"] = read_json(raw["recycle_profile"], "--recycle-profile")
    spec = build_launch_spec(raw)
    nproc = preflight(spec)
    secret = read_job_secret(spec.snapshots.secret_file, environ)
    dry_run, log_format = bool(raw.get("dry_run")), raw.get("log_format", "text")
    return LaunchPlan(spec, nproc, secret, took, dry_run, log_format)


def prepare(plan: LaunchPlan, environ: Mapping[str, str], notify: Notify) -> None:
    """Logging, and everything the user should hear before the agent starts."""
    spec, nproc = plan.spec, plan.nproc
    log.configure(log_format=plan.log_format)
    if plan.secret.value is None and listens_beyond_loopback(spec.rdzv.host, spec.rdzv.is_etcd):
        logger.warning("%s", STORE_FALLBACK_WARNING)
    check_shm(spec.snapshots.memory, nproc, spec.snapshots.copies, environ)
    job = spec.slurm
    if job is not None:  # the first line says what rtrain took from Slurm
        log.set_node(job.nodes[job.node_id])
        logger.info("Slurm job %d: %s", job.job_id, "; ".join(plan.took))
    for flag in spec.ignored_flags:
        notify(f"warning: {flag} is accepted for compatibility but not acted on")
    if omp_threads_default(environ, nproc) is not None:
        notify(OMP_NOTE)
    # The agent's own TCPStore calls must not spray C++ stack traces; workers keep the user's.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


def open_agent(plan: LaunchPlan, base_env: Mapping[str, str], environ: Mapping[str, str]) -> Agent:
    """The GPU health guard and the agent, ready to run; a RtrainError if either cannot be."""
    # Here, not at the top: a --dry-run answers without the agent's imports (~0.2 s).
    from ..agent import Agent
    from ..health.guard import HealthGuard

    health = HealthGuard.open(plan.spec.health, environ)
    agent = Agent(plan.spec, base_env, plan.nproc, health, plan.secret.value)
    logger.info("run %s: logs in %s", plan.spec.rdzv.run_id, agent.run_log_dir)
    return agent


def store_host(spec: LaunchSpec) -> HostChoice | None:
    """Which node hosts the job's TCPStore, and why; None over etcd (no node hosts it)."""
    if spec.rdzv.is_etcd:
        return None
    rdzv = spec.rdzv
    return choose_store_host(rdzv.host, rdzv.backend, rdzv.is_host, spec.node_rank, spec.local_addr)


def read_json(path: str, flag: str) -> object:
    """A JSON file a flag names; a UsageError naming the flag if it cannot be read."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: {exc}") from None
