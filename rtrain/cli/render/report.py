"""`rtrain report`'s table and timeline picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ...core.observe.report import FailureRow, Report
from ...core.observe.report_through import Reduced
from .badput import badput_lines, draw_causes
from .safe_text import plain, shown

OUTCOME_COLOURS = {
    "succeeded": "#59a14f",
    "local_failure": "#e15759",
    "gpu_fault": "#b07aa1",
    "membership_change": "#f28e2b",
    "running": "#4c78a8",
    "lost": "#333333",
}


REPAIRED: dict[str, Any] = {"color": "#59a14f", "mfc": "none", "ms": 9, "mew": 1.5}
REDUCED = "#edc948"  # a node's kept ranks trained at reduced size (train through a fault)


def _seconds(value: float | None, exact: bool = True) -> str:
    """A time lost; '-' where the job ended there (its unfinished tail counts it)."""
    if value is None:
        return "-" if exact else "unknown"
    return f"{value:.2f}" if exact else f">={value:.2f}"


def _steps(steps: int | None, down: float | None) -> str:
    if steps is not None:
        return str(steps)
    return "unknown" if down is not None else "-"


CAPTION = (
    "an incident: a generation that ended in failures, under its root cause; every time "
    "in seconds on one clock: at, from the first event (as the timeline's axis); detect: "
    "from the fault to a node noticing it; down: from the fault (a hang: the last "
    "heartbeat) to the first step after it (>=: to the next start, no heartbeat said "
    "more); steps redone: the step reached before the fault against the first one after "
    "it, from the heartbeats or the snapshot restored (unknown: neither says); also: the "
    "generation's other faults (consequences, e.g. peers of a broken collective); an "
    "unfinished job: the time from its last step to its end; an incident the lines "
    "below the table do not name as repaired in place restarted every worker"
)


def repaired(rows: list[FailureRow]) -> list[str]:
    """One line per incident repaired in place: the ranks that kept their processes and
    those restarted (fallback: asked to repair, did not park in time)."""
    return [
        f"incident at {row.t:.2f} s (gen {row.generation}) repaired in place: "
        f"{row.repair.describe()}"
        for row in rows
        if row.repair is not None
    ]


def print_report(report: Report, wide: bool = False) -> None:
    """The incidents' table and the run's summary; cells wrap at the terminal's width
    (wide: one line per row, for a wide terminal or a file)."""
    console = Console(width=max(Console().width, 200)) if wide else Console()
    table = Table(
        title=f"{len(report.failures)} incident(s) on {len(report.nodes)} node(s)",
        caption=CAPTION,
        caption_justify="left",
    )
    for column in ("at (s)", "gen", "kind", "where", "detect (s)", "down (s)", "steps redone"):
        table.add_column(column, overflow="fold", no_wrap=wide)
    table.add_column("also", overflow="fold", no_wrap=wide)
    for row in report.failures:
        table.add_row(
            f"{row.t:.2f}",
            "-" if row.generation is None else str(row.generation),
            plain(row.kind),
            plain(row.where, limit=120),
            "-" if row.detect_s is None else f"{row.detect_s:.2f}",
            _seconds(row.time_lost_s, row.exact),
            _steps(row.steps_lost, row.time_lost_s),
            str(row.also),
        )
    console.print(table)
    for line in [*repaired(report.failures), *summary(report), *badput_lines(report.badput)]:
        console.print(plain(line, limit=None))
    if report.bad_lines:
        console.print(f"{report.bad_lines} line(s) were not rtrain events and were skipped")


def summary(report: Report) -> list[str]:
    """The run in a few lines: how it ended, its time, what failures cost, its goodput."""
    down = sum(r.time_lost_s or 0.0 for r in report.failures)
    exact = all(r.exact for r in report.failures)
    steps = [r.steps_lost for r in report.failures if r.time_lost_s is not None]
    steps = steps[: len(steps) - report.ended.startswith("unfinished")]
    redone = sum(n or 0 for n in steps)
    unknown = sum(n is None for n in steps)
    step = "unknown" if report.step_s is None else f"{report.step_s:.3f} s"
    final = "unknown" if report.final_step is None else str(report.final_step)
    if report.goodput is None:
        goodput = "unknown"
    else:
        goodput = ("at most " if report.goodput_bound else "") + f"{report.goodput:.1%}"
    again = f"{redone} step(s) done again ({report.redone_s:.2f} s)"
    if unknown:
        again += f", and those of {unknown} incident(s) unknown"
    lines = [
        f"ended: {report.ended or 'unknown'}",
        f"wall time {report.wall_s:.2f} s (from the first event); time lost: "
        f"{report.startup_s:.2f} s starting up (to the first step), "
        f"{'' if exact else '>='}{down:.2f} s down, {again}",
        f"last step reached {final}; {step} per step; goodput {goodput} (wall time less "
        "the start-up, the time down and the steps done again, over wall time)",
    ]
    if report.repairs:
        kept = sum(len(note.kept) for note in report.repairs.values())
        lines.append(
            f"{len(report.repairs)} repair(s) in place: {kept} worker process(es) kept "
            "across them instead of restarted"
        )
    return lines + reduced_lines(report.reduced)


def reduced_lines(stretches: list[Reduced]) -> list[str]:
    """One line per stretch trained at reduced size (train through a fault), and their
    cost as its own cause: reduced throughput, not lost time (not in the goodput)."""
    lines = [
        f"trained at reduced size: {s.seconds:.2f} s at {s.ranks} of {s.world} ranks "
        f"(reduced throughput: {s.reduced_throughput_s:.2f} s of full-size training), "
        f"generation {s.generation}, from {s.start:.2f} s to {s.end:.2f} s ({s.until})"
        for s in stretches
    ]
    if stretches:
        cost = sum(s.reduced_throughput_s for s in stretches)
        lines.append(
            f"reduced throughput: {cost:.2f} s of full-size training in {len(stretches)} "
            "stretch(es) at reduced size (seconds x missing ranks / full size); its own "
            "cause, not lost time: the goodput counts those stretches as trained"
        )
    return lines


def reduced_bars(report: Report) -> list[tuple[int, float, float]]:
    """(lane, start, length) of each node's spans at reduced size, as the timeline draws
    them: on the lane of the node that said it (a node the report has no lane for:
    none)."""
    lane = {node.agent: y for y, node in enumerate(report.nodes)}
    return [
        (lane[node.agent], node.start, node.end - node.start)
        for stretch in report.reduced
        for node in stretch.nodes
        if node.agent in lane
    ]


def no_replication(report: Report) -> str:
    """What the throughput panel says when no replica was sent: whether snapshots were
    taken (a generation's newest committed step, a restore) or none."""
    said = []
    if report.committed is not None:
        said.append(f"newest committed: step {report.committed}")
    said += [f"step {step} restored in gen {gen}" for gen, step in sorted(report.restored.items())]
    if not said:
        return "no snapshots taken (no replication events)"
    return f"snapshots taken ({'; '.join(said)}), none replicated to a peer (one node has none)"


def _label(text: str) -> str:
    """An agent's name as matplotlib draws it: escaped, no mathtext ($...$)."""
    return shown(text, limit=60).replace("$", r"\$")


def draw_report(report: Report, folder: Path) -> list[Path]:
    """rtrain-report.png and .svg in `folder`: per node, its generations (coloured by how
    they ended), its spans at reduced size, downtime, faults (x) and detections (|);
    below, the job's wall time by cause, then replication MB/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = report.nodes
    figure, (lanes, causes, rates) = plt.subplots(
        3,
        1,
        figsize=(12, 1.6 + 0.45 * len(nodes) + 3.2),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(nodes), 1), 0.5, 2]},
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
        lanes.plot([m.t for m in node.repairs], [y] * len(node.repairs), "o", **REPAIRED)
        if node.replication:
            times, speeds = zip(*node.replication, strict=True)
            rates.plot(times, speeds, "o-", ms=3, lw=1, label=_label(node.agent))
    for i, (y, start, length) in enumerate(reduced_bars(report)):
        # its own colour, thinner than the generation's bar it lies on (its gid names it)
        lanes.broken_barh([(start, length)], (y - 0.2, 0.4), color=REDUCED, gid=f"reduced-{i}")
    lanes.set_yticks(range(len(nodes)), [_label(n.agent) for n in nodes], fontsize=8)
    lanes.set_ylim(len(nodes) - 0.5, -0.5)
    lanes.set_title(
        "generations per node (colour: how each ended), reduced size, downtime, faults",
        loc="left",
    )
    legend = _legend()
    figure.legend(handles=legend, fontsize=7, ncol=(len(legend) + 1) // 2, loc="upper right")
    draw_causes(causes, report.badput)
    _rates(rates, report)
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    paths = [folder / "rtrain-report.png", folder / "rtrain-report.svg"]
    for path in paths:
        figure.savefig(path, dpi=110)
    plt.close(figure)
    return paths


def _legend() -> list[Any]:
    """The lanes' legend: each outcome's colour, then the marks drawn on them."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    legend: list[Any] = [Patch(color=c, label=o) for o, c in OUTCOME_COLOURS.items()]
    return [
        *legend,
        Patch(color=REDUCED, label="reduced size"),
        Patch(facecolor="#ddd", hatch="//", label="down"),
        Line2D([], [], marker="x", color="#c00", ls="", label="fault"),
        Line2D([], [], marker="|", color="k", ls="", ms=10, label="detected"),
        Line2D([], [], marker="o", ls="", label="repaired in place", **REPAIRED),
    ]


def _rates(rates: Any, report: Report) -> None:
    """The replication panel: each node's MB/s, or why there is none."""
    rates.set_ylabel("replication MB/s")
    rates.set_xlabel("seconds from the first event")
    rates.set_title("snapshot replication throughput (whole shards / time sending)", loc="left")
    if any(n.replication for n in report.nodes):
        rates.legend(fontsize=7)
    else:
        rates.text(
            0.5,
            0.5,
            no_replication(report),
            ha="center",
            transform=rates.transAxes,
            color="#666",
        )
    rates.grid(alpha=0.3)
