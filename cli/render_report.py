"""`rtrain report`'s table and timeline picture."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..core.observe.report import Report
from .safe_text import plain, shown

OUTCOME_COLOURS = {
    "succeeded": "#59a14f",
    "local_failure": "#e15759",
    "gpu_fault": "#b07aa1",
    "membership_change": "#f28e2b",
    "running": "#4c78a8",
    "lost": "#333333",
}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_report(report: Report) -> None:
    console = Console()
    table = Table(
        title=f"{len(report.failures)} incident(s) on {len(report.nodes)} node(s)",
        caption=(
            "an incident: a generation that ended in failures, under its root cause; "
            "at: seconds from the first event; detect: from the fault to a node noticing "
            "it; time lost: from the first fault to the next generation's start; steps "
            "lost: committed past the step the next generation restored; also: the "
            "generation's other faults (consequences, e.g. peers of a broken collective)"
        ),
        caption_justify="left",
    )
    for column in ("at (s)", "generation", "kind", "where", "detect (s)", "time lost (s)"):
        table.add_column(column, overflow="fold")
    table.add_column("steps lost", overflow="fold")
    table.add_column("also", overflow="fold")
    for row in report.failures:
        table.add_row(
            f"{row.t:.2f}",
            "-" if row.generation is None else str(row.generation),
            plain(row.kind),
            plain(row.where, limit=120),
            _seconds(row.detect_s),
            _seconds(row.time_lost_s),
            "-" if row.steps_lost is None else str(row.steps_lost),
            str(row.also),
        )
    console.print(table)
    lost = sum(r.time_lost_s or 0.0 for r in report.failures)
    goodput = "-" if report.goodput is None else f"{report.goodput:.1%}"
    step = "-" if report.step_s is None else f"{report.step_s:.3f} s"
    final = "-" if report.final_step is None else str(report.final_step)
    console.print(
        f"wall time {report.wall_s:.2f} s, {lost:.2f} s lost to failures; last step {final}, "
        f"{step} per step; goodput {goodput} (wall time less time lost and steps done "
        "again, over wall time)"
    )
    if report.bad_lines:
        console.print(f"{report.bad_lines} line(s) were not rtrain events and were skipped")


def _label(text: str) -> str:
    """An agent's name as matplotlib draws it: escaped, no mathtext ($...$)."""
    return shown(text, limit=60).replace("$", r"\$")


def draw_report(report: Report, folder: Path) -> list[Path]:
    """rtrain-report.png and .svg in `folder`: per node, its generations (coloured by how
    they ended), downtime, faults (x) and detections (|); below, replication MB/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    nodes = report.nodes
    figure, (lanes, rates) = plt.subplots(
        2,
        1,
        figsize=(12, 1.6 + 0.45 * len(nodes) + 2.2),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(nodes), 1), 2]},
    )
    for y, node in enumerate(nodes):
        for span in node.generations:
            colour = OUTCOME_COLOURS.get(span.outcome, "#999")
            lanes.broken_barh([(span.start, span.end - span.start)], (y - 0.35, 0.7), color=colour)
            if span.generation is not None and span.end - span.start > report.wall_s / 40:
                lanes.text(span.start, y, f" g{span.generation}", va="center", fontsize=7)
        for span in node.down:
            lanes.broken_barh(
                [(span.start, span.end - span.start)], (y - 0.35, 0.7), color="#ddd", hatch="//"
            )
        lanes.plot([m.t for m in node.faults], [y] * len(node.faults), "x", color="#c00", ms=8)
        lanes.plot(
            [m.t for m in node.detections], [y] * len(node.detections), "|", color="k", ms=14
        )
        if node.replication:
            times, speeds = zip(*node.replication, strict=True)
            rates.plot(times, speeds, "o-", ms=3, lw=1, label=_label(node.agent))
    lanes.set_yticks(range(len(nodes)), [_label(n.agent) for n in nodes], fontsize=8)
    lanes.set_ylim(len(nodes) - 0.5, -0.5)
    lanes.set_title("generations per node (colour: how each ended), downtime, faults", loc="left")
    legend: list[Artist] = [Patch(color=c, label=o) for o, c in OUTCOME_COLOURS.items()]
    legend += [
        Patch(facecolor="#ddd", hatch="//", label="down"),
        Line2D([], [], marker="x", color="#c00", ls="", label="fault"),
        Line2D([], [], marker="|", color="k", ls="", ms=10, label="detected"),
    ]
    figure.legend(handles=legend, fontsize=7, ncol=len(legend), loc="upper right")
    rates.set_ylabel("replication MB/s")
    rates.set_xlabel("seconds from the first event")
    rates.set_title("snapshot replication throughput (whole shards / time sending)", loc="left")
    if any(n.replication for n in nodes):
        rates.legend(fontsize=7)
    else:
        rates.text(
            0.5,
            0.5,
            "no replication events (no snapshots taken)",
            ha="center",
            transform=rates.transAxes,
            color="#666",
        )
    rates.grid(alpha=0.3)
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    paths = [folder / "rtrain-report.png", folder / "rtrain-report.svg"]
    for path in paths:
        figure.savefig(path, dpi=110)
    plt.close(figure)
    return paths
