"""`rtrain health`: check this node's GPUs, for an operator or a Slurm prolog.

Exit codes follow node-health conventions: 0 healthy, 1 warning, 2 critical, 3 unknown
(no driver, or a check that could not be read and nothing worse). A usage error exits
64, so that a prolog never drains a node because of a typo.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.errors import RtrainError
from ..core.health.history_view import UNKNOWN, HistoryView, history_view
from .render.safe_text import shown

JSON_HELP = "Print the report as JSON (the same fields as the table) instead of a table."


def health(
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    expect_gpus: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="GPUs this node must have (default: what SLURM_GPUS_ON_NODE, "
            "SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES say; none: not checked).",
        ),
    ] = None,
    max_temp: Annotated[
        float | None,
        typer.Option(
            help="Warn at this GPU temperature, C (default: its slowdown "
            "threshold minus --temp-margin)."
        ),
    ] = None,
    temp_margin: Annotated[float, typer.Option(help="See --max-temp, C.")] = 5.0,
    max_uncorrected_ecc: Annotated[
        int, typer.Option(help="Volatile uncorrected ECC errors tolerated per GPU.")
    ] = 0,
    xid_wait: Annotated[
        float,
        typer.Option(min=0, help="Listen for XID events this long, s (NVML keeps no history)."),
    ] = 0.0,
    drain: Annotated[
        bool,
        typer.Option(
            help="Under Slurm: drain this node when the verdict is critical, "
            "with the failed check as the reason."
        ),
    ] = False,
    fake_nvml: Annotated[
        Path | None,
        typer.Option(
            help="Replay this NVML scenario file instead of the driver (drills, "
            "tests; also RTRAIN_FAKE_NVML)."
        ),
    ] = None,
    fault_history: Annotated[
        Path | None,
        typer.Option(
            help="Also show the nodes' fault history kept in this --checkpoint-dir "
            "(each host's faults within --fault-window, the newest entries)."
        ),
    ] = None,
    fault_window: Annotated[
        float, typer.Option(min=0, help="The window of --fault-history's counts, s.")
    ] = 86400.0,
) -> None:
    """Check this node's GPUs: count, lost GPUs, ECC, row remapping, retired pages, XIDs,
    temperature, clock slowdowns, PCIe link, NVLinks, the driver's recovery action."""
    history = None
    if fault_history is not None:
        history = read_history(str(fault_history), fault_window)
        if history is None:
            raise typer.Exit(int(UNKNOWN))
    raise typer.Exit(
        run_health(
            as_json=as_json,
            expect_gpus=expect_gpus,
            thresholds=(max_temp, temp_margin, max_uncorrected_ecc),
            xid_wait=xid_wait,
            drain=drain,
            fake_nvml=str(fake_nvml) if fake_nvml else None,
            history=history,
        )
    )


def read_history(folder: str, window_s: float) -> HistoryView | None:
    """The fault history in `folder` as health shows it; None (said in one line) when
    the file is not one (a flipped byte, a torn or oversized file)."""
    import time

    from ..agent.health.fault_history import read_history_file
    from ..core.rendezvous.fault_history import HISTORY_FILE, HistoryError

    path = os.path.join(folder, HISTORY_FILE)
    try:
        entries = read_history_file(path)
    except HistoryError as exc:
        print(f"rtrain: error: fault history {shown(path, None)}: {exc}", file=sys.stderr)
        return None
    return history_view(path, entries, window_s, time.time())


def run_health(
    as_json: bool,
    expect_gpus: int | None,
    thresholds: tuple[float | None, float, int],
    xid_wait: float,
    drain: bool,
    fake_nvml: str | None,
    history: HistoryView | None = None,
) -> int:
    from ..agent.health.drain import DrainError, drain_node, slurm_node_name
    from ..agent.health.nvml_reader import NvmlReader, NvmlUnavailable, collect_xids, open_nvml
    from ..core.health.gpu_health import Thresholds, Verdict, evaluate_node
    from ..core.health.gpu_inventory import expected_gpus, watched_gpus

    try:
        limits = Thresholds(*thresholds)
        expected = expect_gpus if expect_gpus is not None else expected_gpus(os.environ)
        node = slurm_node_name(os.environ) if drain else None
        nvml = open_nvml(fake=fake_nvml)
    except NvmlUnavailable as exc:
        _say_unknown(str(exc), as_json)
        return int(Verdict.UNKNOWN)
    except RtrainError as exc:
        print(f"rtrain: error: {shown(exc, None)}", file=sys.stderr)
        return exc.exit_code
    reader = NvmlReader(nvml)
    samples = watched_gpus(reader.sample_all(), os.environ)
    events = collect_xids(nvml, reader.count(), xid_wait)
    for event in events:
        target = next((s for s in samples if s.index == event.gpu), None)
        if target is not None:
            target.xids.append(event)
    report = evaluate_node(samples, expected, limits)
    if as_json:
        payload = report.to_json()
        if history is not None:
            payload["fault_history"] = history.to_json()
        print(json.dumps(payload, indent=2))
    else:
        from .render.health import print_history, print_report

        print_report(report)
        if history is not None:
            print_history(history)
    if node is not None and report.verdict is Verdict.CRITICAL:
        failed = "; ".join(
            f"{'node' if gpu is None else f'GPU {gpu}'} {c.check}: {c.reading}"
            for gpu, c in report.findings()
            if c.verdict is Verdict.CRITICAL
        )
        try:
            drain_node(node, f"rtrain health: {failed}")
            print(f"rtrain: drained {shown(node, None)}", file=sys.stderr)
        except DrainError as exc:
            print(f"rtrain: error: {shown(exc, None)}", file=sys.stderr)
    return report.exit_code


def _say_unknown(message: str, as_json: bool) -> None:
    if as_json:
        payload: dict[str, Any] = {"verdict": "unknown", "exit_code": 3, "error": message}
        print(json.dumps(payload, indent=2))
    print(f"rtrain: {shown(message, None)}", file=sys.stderr)
