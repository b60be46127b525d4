"""The `rtrain` command.

`rtrain launch` keeps torchrun's exact grammar, so its arguments go straight to
cli.launch_args (argparse) rather than through typer; the other commands are typer's.
Nothing here imports torch: `rtrain --help` must answer at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import typer

from ..core.errors import ExitCode, RtrainError, UsageError, exit_code_for_signal
from .health import health
from .plan import plan_command
from .report import report_command
from .status import status_command

if TYPE_CHECKING:
    from ..core.config.launch_spec import LaunchSpec

app = typer.Typer(
    name="rtrain",
    help="A fault-tolerant launcher for distributed PyTorch training (a drop-in torchrun).",
    no_args_is_help=True,
    # --install-completion / --show-completion: the shell completes commands and options
    # (launch's flags are argparse's, after `launch`, and are not completed)
    add_completion=True,
)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def launch(ctx: typer.Context) -> None:
    """Launch training: takes every torchrun flag (see `rtrain launch --help`)."""
    raise typer.Exit(run_launch(ctx.args, os.environ))


app.command("health")(health)
app.command("plan")(plan_command)
app.command("report")(report_command)
app.command("status")(status_command)


def _print_version(value: bool) -> None:
    if value:
        from rtrain import __version__

        print(f"rtrain {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print rtrain's version and exit.",
    ),
) -> None:
    """rtrain: launch training that survives crashed ranks, hung ranks, sick GPUs, lost nodes."""


# The one-line reason of launch's exit, for the container's termination message.
_exit_reason: list[str] = []


def _error(message: str) -> None:
    _exit_reason.append(message)
    print(f"rtrain: error: {message}", file=sys.stderr)


def run_launch(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from rich.console import Console

    from ..core.config.launch_spec import build_launch_spec
    from ..core.config.slurm.env import apply_slurm, read_slurm_job
    from ..core.config.worker_env import omp_threads_default
    from .launch_args import parse_launch_args
    from .render import launch as render

    base_env = dict(environ)
    took: list[str] = []
    try:
        raw = parse_launch_args(argv, environ)
        job = read_slurm_job(environ)
        if job is not None:
            from ..agent.slurm import resolve_node_address

            names = {job.head, job.nodes[job.node_id]}
            addresses = {name: resolve_node_address(name) for name in names}
            raw, took = apply_slurm(raw, raw["explicit"], job, addresses)
            raw["slurm"] = job
        if raw.get("recycle_profile"):
            raw["recycle_profile_data"] = _read_json(raw["recycle_profile"], "--recycle-profile")
        spec = build_launch_spec(raw)
        from ..agent.preflight import preflight

        nproc = preflight(spec)
        from ..agent.snapshots.job_secret import read_job_secret

        secret = read_job_secret(spec.snapshots.secret_file, environ)
    except RtrainError as exc:
        _error(str(exc))
        return exc.exit_code
    if raw.get("dry_run"):
        render.dry_run(Console(), spec, nproc, took, _store_host(spec))
        return ExitCode.SUCCESS
    from ..agent.observe import log

    log.configure(log_format=raw.get("log_format", "text"))
    from ..agent.store.opening import listens_beyond_loopback

    if secret.value is None and listens_beyond_loopback(spec.rdzv.host, spec.rdzv.is_etcd):
        from ..agent.snapshots.job_secret import STORE_FALLBACK_WARNING

        logging.getLogger("rtrain.cli").warning("%s", STORE_FALLBACK_WARNING)
    from ..agent.kube.shm import check_shm

    check_shm(spec.snapshots.memory, nproc, spec.snapshots.copies, environ)
    job = spec.slurm
    if job is not None:  # the first line says what rtrain took from Slurm
        node = job.nodes[job.node_id]
        log.set_node(node)
        logging.getLogger("rtrain.cli").info("Slurm job %d: %s", job.job_id, "; ".join(took))
    for flag in spec.ignored_flags:
        print(
            f"rtrain: warning: {flag} is accepted for compatibility but not acted on",
            file=sys.stderr,
        )
    if omp_threads_default(environ, nproc) is not None:
        print(
            "rtrain: OMP_NUM_THREADS is unset; setting it to 1 for each worker "
            "(tune it for your application)",
            file=sys.stderr,
        )
    # The agent's own TCPStore calls must not spray C++ stack traces; workers keep the user's.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ..agent.agent import Agent
    from ..agent.health.guard import HealthGuard
    from ..agent.state import AgentState

    try:
        health = HealthGuard.open(spec.health, environ)
    except RtrainError as exc:
        _error(str(exc))
        return exc.exit_code
    try:
        agent = Agent(spec, base_env, nproc, health, secret.value)
    except RtrainError as exc:
        _error(str(exc))
        return exc.exit_code
    logging.getLogger("rtrain.cli").info("run %s: logs in %s", spec.rdzv.run_id, agent.run_log_dir)
    result = agent.run()
    console = render.report_console()
    if result.state is AgentState.SUCCEEDED:
        if result.failures:
            render.recovery_report(console, spec.entrypoint.target, result.failures)
        return result.exit_code
    if result.failures:
        _exit_reason.append(result.message)
        render.failure_report(console, spec.entrypoint.target, result.failures, result.message)
    else:
        _error(result.message)
    return result.exit_code


def _store_host(spec: LaunchSpec) -> str | None:
    """Which node hosts the job's TCPStore, and why; None over etcd (no node hosts it)."""
    if spec.rdzv.is_etcd:
        return None
    from ..agent.store.store_host import choose_store_host

    rdzv = spec.rdzv
    choice = choose_store_host(
        rdzv.host, rdzv.backend, rdzv.is_host, spec.node_rank, spec.local_addr
    )
    hosts = {True: "this node", False: "another node", None: "this node (if its port is free)"}
    return f"{hosts[choice.hosts]}: {choice.reason}"


def _read_json(path: str, flag: str) -> object:
    import json

    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: {exc}") from None


def _is_usage_error(exc: Exception) -> bool:
    """click's ClickException, whether typer uses click or (typer >= 0.25) its own copy."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "launch":
            code = run_launch(args[1:], os.environ)
        else:
            code = app(args=args, prog_name="rtrain", standalone_mode=False) or 0
    except KeyboardInterrupt:
        code = exit_code_for_signal(signal.SIGINT)
    except typer.Exit as exc:
        code = exc.exit_code
    except Exception as exc:  # usage errors arrive here with standalone_mode=False
        if not _is_usage_error(exc):
            raise
        _error(exc.format_message())  # type: ignore[attr-defined]
        code = ExitCode.USAGE
    if args and args[0] == "launch" and code:
        from ..agent.kube.termination_log import write_termination_log

        reason = _exit_reason[-1] if _exit_reason else f"exit {code}"
        write_termination_log(int(code), reason, os.environ)
    if args and args[0] in ("launch", "status"):
        # A TCPStore connect that outlived its deadline still runs in a C++ thread;
        # interpreter shutdown would then abort ("terminate called without an active
        # exception", exit -6). Nothing is left to clean up by now: leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    sys.exit(int(code))


if __name__ == "__main__":
    main()
