"""Timelines as PNG pictures (matplotlib): `rtrain plan`'s schedule, and the benchmark's
measured and simulated timelines one above the other on one time axis.

matplotlib comes with the `plan` extra (pip install 'rtrain[plan]'); without it the
caller says so in one line and keeps the SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...core.planner.report import COLOURS, TimelineRow

Panel = tuple[str, Sequence[TimelineRow]]  # (title, rows)


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_timeline_png(path: Path, panels: Sequence[Panel], unit: str) -> None:
    """One panel per (title, rows), stacked, sharing the time axis (in `unit`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    height = sum(0.28 * len(rows) + 0.9 for _, rows in panels) + 0.6
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(12, height),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [max(len(rows), 1) for _, rows in panels]},
    )
    for axis, (title, rows) in zip(axes[:, 0], panels, strict=True):
        for y, row in enumerate(rows):
            if row.failed:
                axis.text(0, y, "  failed", va="center", color="#c00", fontsize=8)
                continue
            spans = [(start, end - start) for _, start, end, _ in row.blocks]
            colours = [COLOURS.get(kind, "#000") for kind, *_ in row.blocks]
            axis.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours, edgecolor="white", lw=0.3)
        axis.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=8)
        axis.set_ylim(len(rows) - 0.5, -0.5)
        axis.set_title(title, fontsize=10, loc="left")
        axis.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    legend = [Patch(color=colour, label=kind) for kind, colour in COLOURS.items()]
    figure.legend(handles=legend, loc="upper right", ncol=len(legend), fontsize=8)
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)
