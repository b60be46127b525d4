"""`rtrain report`'s wall time by cause as text: a stacked bar of a fixed width, one
letter a cause, and a line per cause that had time."""

from __future__ import annotations

from rtrain.cli.render.badput import BAR_WIDTH, CAUSE_MARKS, badput_lines, bar
from rtrain.core.observe.badput.causes import CAUSES
from rtrain.core.observe.badput.job import Badput


def test_the_bar_is_its_width_in_share_and_a_cause_with_any_time_shows() -> None:
    seconds = {**dict.fromkeys(CAUSES, 0.0), "training": 90.0, "restart": 9.9, "restore": 0.1}
    drawn = bar(seconds)
    assert len(drawn) == BAR_WIDTH
    assert drawn.count("T") == 53 and drawn.count("R") == 6 and drawn.count("O") == 1
    assert drawn == "".join(sorted(drawn, key=lambda m: list(CAUSE_MARKS.values()).index(m)))
    assert bar(dict.fromkeys(CAUSES, 0.0)) == ""


def test_the_lines_name_each_cause_with_time_and_its_share() -> None:
    seconds = {**dict.fromkeys(CAUSES, 0.0), "training": 75.0, "hang_wait": 25.0}
    lines = badput_lines(Badput(100.0, seconds, 0.75))
    assert lines[0].endswith(f"[{'T' * 45}{'H' * 15}]")
    assert lines[1:] == ["  T training: 75.00 s (75.0%)", "  H hang_wait: 25.00 s (25.0%)"]
    assert badput_lines(None) == [] and badput_lines(Badput(0.0, seconds, None)) == []
