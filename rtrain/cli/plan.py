"""`rtrain plan`: what ReCycle would do for a failure set, against the alternatives.

    rtrain plan --dp 4 --pp 4 --microbatches 8 --fail 1:2 --fail 3:0

prints a table (fault-free 1F1B, ReCycle, dropping the replicas that lost a worker,
restarting from a checkpoint; its caption says what each figure means, in which unit)
and writes ReCycle's timeline to --timeline in the format its suffix names: .svg (and,
with matplotlib, a PNG beside it) or .png (matplotlib: the `plan` extra); --json prints
the plan as a per-rank action list instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..core.config.flag_values import ascii_int
from ..core.errors import RtrainError, UsageError
from .render.safe_text import shown

if TYPE_CHECKING:
    from ..core.planner.plan import Plan
    from ..core.planner.sim import SimResult

FAIL_HELP = "A failed worker REPLICA:STAGE (both from 0); repeat for several."
# Durations are in whatever unit the job was described in: seconds for a measured
# profile, or the abstract unit of --forward and friends.
TIME_UNIT = "the durations' unit"


def plan_command(
    dp: Annotated[int, typer.Option(help="Data-parallel replicas.")],
    pp: Annotated[int, typer.Option(help="Pipeline stages.")],
    microbatches: Annotated[int, typer.Option(help="Micro-batches per replica per iteration.")],
    fail: Annotated[list[str] | None, typer.Option(help=FAIL_HELP)] = None,
    forward: Annotated[float, typer.Option(help="F time per stage.")] = 1.0,
    backward_input: Annotated[float, typer.Option(help="B time per stage.")] = 1.0,
    backward_weight: Annotated[float, typer.Option(help="W time per stage.")] = 1.0,
    optimizer: Annotated[float, typer.Option(help="Optimizer step time.")] = 0.2,
    transfer: Annotated[float, typer.Option(help="Activation transfer time.")] = 0.05,
    memory: Annotated[
        int | None, typer.Option(help="Micro-batches a worker may hold (default PP).")
    ] = None,
    profile: Annotated[
        Path | None, typer.Option(help="Measured per-stage durations (JSON); overrides the above.")
    ] = None,
    restart_cost: Annotated[
        float, typer.Option(help="Seconds a checkpoint restart costs.")
    ] = 600.0,
    failure_rate: Annotated[float, typer.Option(help="Failures per hour (for restart).")] = 0.3,
    timeline: Annotated[
        Path,
        typer.Option(help="ReCycle's timeline: .svg (a PNG beside it) or .png (the plan extra)."),
    ] = Path("recycle-timeline.svg"),
    exact: Annotated[bool, typer.Option(help="Solve exactly (MILP; small jobs only).")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the per-rank action list.")
    ] = False,
) -> None:
    """Plan the schedule that absorbs a failure set (ReCycle), against the alternatives."""
    try:
        code = run_plan(
            dp,
            pp,
            microbatches,
            fail or [],
            (forward, backward_input, backward_weight, optimizer),
            transfer,
            memory,
            profile,
            restart_cost,
            failure_rate,
            timeline,
            exact,
            as_json,
        )
    except RtrainError as exc:
        print(f"rtrain: error: {shown(exc, None)}", file=sys.stderr)
        code = exc.exit_code
    raise typer.Exit(code)


@contextlib.contextmanager
def _solver_output_to_stderr() -> Iterator[None]:
    """HiGHS prints diagnostics from C++ straight to fd 1: keep stdout for --json."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# dp x pp x microbatches past which the heuristic takes minutes (linear: 16k cells
# took 9-19 s on one core here); the exact solver has its own, smaller limit.
MAX_PLAN_CELLS = 16384


def parse_fail(text: str) -> tuple[int, int]:
    replica, sep, stage = text.partition(":")
    numbers = ascii_int(replica), ascii_int(stage)
    if not sep or numbers[0] is None or numbers[1] is None:
        raise UsageError(f"--fail {text!r}: expected REPLICA:STAGE, e.g. 1:2")
    return numbers[0], numbers[1]


PICTURE_SUFFIXES = (".svg", ".png")


def check_timeline(timeline: Path) -> None:
    """The suffix picks the format; a PNG needs matplotlib (the `plan` extra)."""
    suffix = timeline.suffix.lower()
    if suffix not in PICTURE_SUFFIXES:
        raise UsageError(
            f"--timeline {timeline}: the suffix picks the format, .svg or .png "
            f"(not {suffix or 'none'!r})"
        )
    from .render.timeline import have_matplotlib

    if suffix == ".png" and not have_matplotlib():
        raise UsageError(
            f"--timeline {timeline}: a PNG needs matplotlib (pip install 'rtrain[plan]'); "
            "or name an .svg"
        )


def run_plan(
    dp: int,
    pp: int,
    microbatches: int,
    fail: list[str],
    durations: tuple[float, float, float, float],
    transfer: float,
    memory: int | None,
    profile: Path | None,
    restart_cost: float,
    failure_rate: float,
    timeline: Path,
    exact: bool,
    as_json: bool,
) -> int:
    from ..core.planner.job import PipelineJob
    from ..core.planner.report import action_list, compare
    from ..core.planner.sim import simulate

    numbers = {
        "--restart-cost": restart_cost,
        "--failure-rate": failure_rate,
        "--transfer": transfer,
    }
    numbers.update(
        zip(
            ("--forward", "--backward-input", "--backward-weight", "--optimizer"),
            durations,
            strict=True,
        )
    )
    for flag, number in numbers.items():
        if not math.isfinite(number):  # negative ones are refused with the job's check
            raise UsageError(f"{flag}: expected a finite number, got {number}")
    if restart_cost < 0 or failure_rate < 0:
        raise UsageError("--restart-cost and --failure-rate must be >= 0")
    cells = dp * pp * microbatches
    if min(dp, pp, microbatches) >= 1 and cells > MAX_PLAN_CELLS:
        raise UsageError(
            f"--dp x --pp x --microbatches = {cells} is more than rtrain plan handles "
            f"({MAX_PLAN_CELLS}; about 20 s on one core): plan a smaller model of the job, "
            "the schedule repeats per replica"
        )
    failed = [parse_fail(f) for f in fail]
    if not as_json:
        check_timeline(timeline)
    if profile is not None:
        try:
            data = json.loads(profile.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--profile {profile}: {exc}") from None
        job = PipelineJob.from_profile(data, dp, pp, microbatches)
    else:
        f, b, w, o = durations
        job = PipelineJob.uniform(dp, pp, microbatches, f, b, w, o, transfer, memory)
    options, recycle, sim = compare(job, failed, restart_cost, failure_rate)
    if exact and failed:
        from ..core.planner.milp import plan_exact

        with _solver_output_to_stderr():
            recycle = plan_exact(job, failed)
        sim = simulate(recycle)
    if as_json:
        if recycle is None or sim is None:
            raise UsageError(options[1].note)
        print(json.dumps(action_list(recycle, sim), indent=1))
        return 0
    from .render.plan import print_comparison

    print_comparison(job, failed, options)
    if recycle is not None and sim is not None:
        title = f"ReCycle, DP={dp} PP={pp} M={microbatches}, failed {sorted(failed)}: " + (
            f"iteration {sim.iteration_time:.2f}"
        )
        write_timeline(timeline, title, recycle, sim)
    return 0


def write_timeline(timeline: Path, title: str, recycle: Plan, sim: SimResult) -> None:
    """The picture in the format the suffix names (checked before); an SVG gets a PNG
    beside it where matplotlib is installed."""
    from ..core.planner.report import timeline_rows, timeline_svg
    from .render.timeline import have_matplotlib, write_timeline_png

    if timeline.suffix.lower() == ".svg":
        try:
            timeline.write_text(timeline_svg(recycle, sim, title))
        except OSError as exc:
            raise UsageError(f"--timeline {timeline}: {exc.strerror}") from None
        print(f"timeline: {shown(timeline, None)}")
        picture = timeline.with_suffix(".png")
        if not have_matplotlib():
            print(f"no {picture.name}: matplotlib is not installed (pip install 'rtrain[plan]')")
            return
    else:
        picture = timeline
    try:
        write_timeline_png(picture, [(title, timeline_rows(recycle, sim))], TIME_UNIT)
    except OSError as exc:
        raise UsageError(f"--timeline {picture}: {exc.strerror}") from None
    print(f"timeline: {shown(picture, None)}")
