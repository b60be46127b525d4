"""The `rtrain` command.

`rtrain launch` keeps torchrun's exact grammar, so its arguments go straight to
cli.launch_args (argparse) rather than through typer; the other commands are typer's.
Nothing here imports torch: `rtrain --help` must answer at once.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import typer

from ..core.errors import ExitCode, RtrainError, exit_code_for_signal
from .health import health
from .launch_args import parse_launch_args
from .plan import plan_command
from .report import report_command
from .status import status_command

if TYPE_CHECKING:
    from ..agent.launch.startup import LaunchOutcome

app = typer.Typer(
    name="rtrain",
    help="A fault-tolerant launcher for distributed PyTorch training (a drop-in torchrun).",
    no_args_is_help=True,
    # --install-completion / --show-completion: the shell completes commands and options
    # (launch's flags are argparse's, after `launch`, and are not completed)
    add_completion=True,
    # click's help, not rich's boxes: rich cut option names and help at 80 columns
    # ("--max-uncorrected-…"); click's wraps every cell whole at any width
    rich_markup_mode=None,
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


def _note(text: str) -> None:
    print(f"rtrain: {text}", file=sys.stderr)


def run_launch(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Parse launch's flags, hand them to the agent's start-up, render how it ended."""
    try:
        raw = parse_launch_args(argv, environ)
    except RtrainError as exc:
        _error(str(exc))
        return exc.exit_code
    # Here, not at the top: `rtrain --help` answers without the launch's imports.
    from ..agent.launch.startup import launch as start_up

    outcome = start_up(raw, environ, _note)
    _render(outcome)
    return outcome.exit_code


def _render(outcome: LaunchOutcome) -> None:
    """The error, the dry run's tables, or the faults of the run (that it survived or
    that ended it)."""
    from rich.console import Console

    from .render import launch as render

    plan, result = outcome.plan, outcome.result
    if outcome.error is not None or plan is None:
        _error(str(outcome.error))
    elif result is None:  # a dry run
        render.dry_run(
            Console(),
            plan.spec,
            plan.nproc,
            plan.took,
            outcome.store_host,
            outcome.no_gpu_checks,
            outcome.state_net,
        )
    elif outcome.succeeded:
        script = plan.spec.entrypoint.target
        if result.failures:
            generations = result.generation + 1
            render.recovery_report(render.report_console(), script, result.failures, generations)
        _note(render.success_line(script, result))
    elif result.failures:
        _exit_reason.append(result.message)
        script, message = plan.spec.entrypoint.target, result.message
        console = render.report_console()
        render.failure_report(console, script, result.failures, message)
        render.recovery_hint(console, plan.spec.max_restarts)
    else:
        _error(result.message)


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
