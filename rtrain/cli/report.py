"""`rtrain report LOGDIR`: what happened to a job, from its nodes' structured events.

    rtrain report /shared/logs/job42

reads every events.jsonl under LOGDIR (one per node's run folder; gather them in one
folder from many machines), prints a summary (each failure with the time and steps it
cost, the run's goodput, each stretch trained at reduced size through a fault with its
reduced throughput, the wall time by cause as a stacked bar) and writes a timeline
picture, PNG and SVG: each node's generations, its spans at reduced size, faults,
detections and downtime, the job's causes over time, and snapshot replication
throughput over time. Exit 0; 64 with one line if LOGDIR holds no events.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import RtrainError, UsageError
from ..core.observe.events import EVENTS_FILE, Event, read_events
from .render.safe_text import shown

OUT_HELP = "Folder for rtrain-report.png and .svg (default: LOGDIR)."


def report_command(
    logdir: Annotated[Path, typer.Argument(help="A run's log folder (--log-dir), or many.")],
    out: Annotated[Path | None, typer.Option(help=OUT_HELP)] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON; draw nothing.")
    ] = False,
    wide: Annotated[
        bool, typer.Option(help="One line per table row (at least 200 columns), no wrapping.")
    ] = False,
) -> None:
    """Summarize a job's failures, recoveries and goodput from its events, with a timeline."""
    try:
        code = run_report(logdir, out, as_json, wide)
    except RtrainError as exc:
        print(f"rtrain: error: {shown(exc, None)}", file=sys.stderr)
        code = exc.exit_code
    raise typer.Exit(code)


def load_events(logdir: Path) -> tuple[list[Event], int]:
    """Every event of every events.jsonl under `logdir`; how many lines were not events."""
    if not logdir.is_dir():
        raise UsageError(f"{logdir}: not a folder")
    events: list[Event] = []
    bad = 0
    for path in sorted(logdir.rglob(EVENTS_FILE)):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                found, skipped = read_events(handle)
        except OSError as exc:
            raise UsageError(f"{path}: {exc.strerror}") from None
        events += found
        bad += skipped
    if not events:
        raise UsageError(f"{logdir}: no rtrain events ({EVENTS_FILE}) under it")
    return events, bad


def run_report(logdir: Path, out: Path | None, as_json: bool, wide: bool = False) -> int:
    from ..core.observe.report import build_report

    events, bad = load_events(logdir)
    report = build_report(events, bad)
    if as_json:
        print(json.dumps(asdict(report), indent=1))
        return 0
    from .render.report import draw_report, print_report
    from .render.timeline import have_matplotlib

    print_report(report, wide)
    folder = out or logdir
    if not have_matplotlib():  # a dependency of rtrain's (setup.cfg): a broken install
        print("no picture: matplotlib, a dependency of rtrain, is missing: pip install matplotlib")
        return 0
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths = draw_report(report, folder)
    except OSError as exc:
        raise UsageError(f"--out {folder}: {exc.strerror}") from None
    for path in paths:
        print(f"timeline: {shown(path, None)}")
    return 0
