"""The `rtrain health` table: one row per GPU, the reading behind every failed check."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...core.health.gpu_health import HealthReport, Verdict
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
