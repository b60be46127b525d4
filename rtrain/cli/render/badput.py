"""`rtrain report`'s wall time by cause: a stacked text bar with each cause's seconds,
and the picture's band of the job's causes over time (core/observe/badput.py says
what each cause is)."""

from __future__ import annotations

from typing import Any

from ...core.observe.badput.causes import CAUSES
from ...core.observe.badput.job import Badput

BAR_WIDTH = 60
# one letter a cause in the text bar, one colour a cause in the picture
CAUSE_MARKS = {
    "training": "T",
    "startup": "S",
    "rendezvous": "V",
    "restore": "O",
    "restart": "R",
    "hang_wait": "H",
    "repair": "P",
    "reduced_size": "Z",
    "straggler": "G",
    "snapshot_overhead": "N",
}
CAUSE_COLOURS = {
    "training": "#59a14f",
    "startup": "#bab0ac",
    "rendezvous": "#76b7b2",
    "restore": "#4e79a7",
    "restart": "#e15759",
    "hang_wait": "#9c0d38",
    "repair": "#f28e2b",
    "reduced_size": "#edc948",
    "straggler": "#b07aa1",
    "snapshot_overhead": "#9d7660",
}


def bar(seconds: dict[str, float], width: int = BAR_WIDTH) -> str:
    """The causes' shares as `width` letters, in CAUSES' order (largest remainders
    round, so the letters add up to the width; a cause with any time gets one)."""
    total = sum(seconds.values())
    if total <= 0:
        return ""
    exact = {c: seconds.get(c, 0.0) / total * width for c in CAUSES}
    cells = {c: int(v) for c, v in exact.items()}
    for cause in sorted(CAUSES, key=lambda c: cells[c] - exact[c])[: width - sum(cells.values())]:
        cells[cause] += 1
    for cause in CAUSES:  # a cause too small for a cell still shows, taken from the largest
        if seconds.get(cause, 0.0) > 0 and cells[cause] == 0:
            largest = max(CAUSES, key=lambda c: cells[c])
            if cells[largest] > 1:
                cells[largest] -= 1
                cells[cause] = 1
    return "".join(CAUSE_MARKS[c] * cells[c] for c in CAUSES)


def badput_lines(badput: Badput | None) -> list[str]:
    """The split as a bar and a line per cause that had time (all zero: none)."""
    if badput is None or badput.wall_s <= 0:
        return []
    lines = [
        f"wall time by cause ({badput.wall_s:.2f} s, every second to one cause; "
        "training counts steps later done again): "
        f"[{bar(badput.seconds)}]"
    ]
    for cause in CAUSES:
        value = badput.seconds.get(cause, 0.0)
        if value > 0:
            share = value / badput.wall_s
            lines.append(f"  {CAUSE_MARKS[cause]} {cause}: {value:.2f} s ({share:.1%})")
    return lines


def draw_causes(axis: Any, badput: Badput | None) -> None:
    """The job's causes over time, one band (the picture's middle panel)."""
    axis.set_yticks([])
    axis.set_title("the job's wall time by cause", loc="left")
    if badput is None:
        return
    for window in badput.timeline:
        colour = CAUSE_COLOURS.get(window.cause, "#999")
        axis.broken_barh([(window.start, window.end - window.start)], (0, 1), color=colour)
    from matplotlib.patches import Patch

    shown = [c for c in CAUSES if badput.seconds.get(c, 0.0) > 0]
    handles = [Patch(color=CAUSE_COLOURS[c], label=c) for c in shown]
    if handles:
        axis.legend(
            handles=handles,
            fontsize=7,
            ncol=len(handles),
            loc="upper left",
            bbox_to_anchor=(0, -0.15),
            frameon=False,
        )
