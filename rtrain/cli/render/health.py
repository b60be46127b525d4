"""The `rtrain health` table: one row per GPU, the reading behind every failed check;
and, with --fault-history, the nodes' faults."""

from __future__ import annotations

import datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...core.health.gpu_health import HealthReport, Verdict
from ...core.health.history_view import HistoryView
from .safe_text import plain

STYLES = {
    Verdict.OK: "green",
    Verdict.WARNING: "yellow",
    Verdict.CRITICAL: "bold red",
    Verdict.UNKNOWN: "magenta",
    Verdict.NA: "dim",
}


def _verdict(verdict: Verdict) -> Text:
    return Text(verdict.label.upper(), style=STYLES[verdict])


def print_report(report: HealthReport, console: Console | None = None) -> None:
    console = console or Console()
    expected = "" if report.expected is None else f" of {report.expected} expected"
    table = Table(
        title=Text.assemble(
            "GPU health: ", _verdict(report.verdict), f" ({report.found} GPUs{expected})"
        ),
        title_justify="left",
    )
    for column in ("GPU", "name", "UUID", "verdict", "findings (check: reading -> action)"):
        table.add_column(column, overflow="fold")
    for gpu in report.gpus:
        findings = [
            plain(f"{c.check}: {c.reading}")
            + Text(f" -> {c.action.value}" if c.action.value != "none" else "")
            for c in gpu.failed
        ]
        table.add_row(
            str(gpu.index),
            plain(gpu.name),
            plain(gpu.uuid),
            _verdict(gpu.verdict),
            Text("\n").join(findings) if findings else Text("all checks passed", style="dim"),
        )
    console.print(table)
    for check in report.node_checks:
        if check.failed:
            action = f" -> {check.action.value}" if check.action.value != "none" else ""
            reading = plain(f"{check.check}: {check.reading}")
            console.print(Text("node: ") + _verdict(check.verdict) + " " + reading + action)


def print_history(view: HistoryView, console: Console | None = None) -> None:
    """Each host's faults within the window, then the newest entries."""
    console = console or Console()
    hours = view.window_s / 3600
    table = Table(
        title=plain(f"fault history: {view.total} entries in {view.path}"), title_justify="left"
    )
    for column in ("host", f"faults in {hours:g} h", "newest"):
        table.add_column(column, overflow="fold")
    newest = {e.host: e for e in view.newest}
    for host, count in sorted(view.recent.items(), key=lambda item: (-item[1], item[0])):
        last = newest.get(host)
        when = "" if last is None else f"{last.kind} at {_when(last.time)}"
        table.add_row(plain(host), str(count), plain(when))
    if not view.recent:
        table.add_row(Text("none", style="dim"), "0", "")
    console.print(table)


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
