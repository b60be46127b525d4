"""The `rtrain health` table: one row per GPU, the reading behind every failed check."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core.health.gpu_health import HealthReport, Verdict

STYLES = {
    Verdict.OK: "green",
    Verdict.WARNING: "yellow",
    Verdict.CRITICAL: "bold red",
    Verdict.UNKNOWN: "magenta",
    Verdict.NA: "dim",
}


def _verdict(verdict: Verdict) -> str:
    return f"[{STYLES[verdict]}]{verdict.label.upper()}[/]"


def print_report(report: HealthReport, console: Console | None = None) -> None:
    console = console or Console()
    expected = "" if report.expected is None else f" of {report.expected} expected"
    table = Table(
        title=f"GPU health: {_verdict(report.verdict)} ({report.found} GPUs{expected})",
        title_justify="left",
    )
    for column in ("GPU", "name", "UUID", "verdict", "findings (check: reading -> action)"):
        table.add_column(column, overflow="fold")
    for gpu in report.gpus:
        findings = [
            f"{c.check}: {escape(c.reading)}"
            + (f" -> {c.action.value}" if c.action.value != "none" else "")
            for c in gpu.failed
        ]
        table.add_row(
            str(gpu.index),
            escape(gpu.name),
            escape(gpu.uuid),
            _verdict(gpu.verdict),
            "\n".join(findings) or "[dim]all checks passed[/]",
        )
    console.print(table)
    for check in report.node_checks:
        if check.failed:
            action = f" -> {check.action.value}" if check.action.value != "none" else ""
            console.print(
                f"node: {_verdict(check.verdict)} {check.check}: {escape(check.reading)}{action}"
            )
