"""`rtrain report` shows a stretch trained at reduced size through a fault: a line of
the summary with its reduced throughput, the --json form, and a span in its own colour
on each node's lane of the timeline."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from rtrain.cli.render.report import print_report, reduced_bars, summary
from rtrain.cli.report import run_report
from rtrain.core.observe.events import EVENTS_FILE, event_line
from rtrain.core.observe.report import build_report
from tests.unit.core.test_report_through import JOINED, _run

LINE = (
    "trained at reduced size: 28.50 s at 3 of 4 ranks (reduced throughput: 7.12 s of "
    "full-size training), generation 1, from 11.50 s to 40.00 s (full size again)"
)


def test_the_summary_says_the_stretch_and_its_cost_as_its_own_cause(capsys) -> None:
    lines = summary(build_report(_run(JOINED)))
    assert lines[-2] == LINE
    assert lines[-1].startswith("reduced throughput: 7.12 s of full-size training in 1 ")
    assert "not lost time" in lines[-1]
    print_report(build_report(_run(JOINED)), wide=True)
    assert LINE in capsys.readouterr().out
    assert not any("reduced" in line for line in summary(build_report(_run([]))))


def _logs(folder: Path) -> Path:
    folder.mkdir()
    lines = [event_line(e.name, e.t, e.agent, e.node, e.generation, e.fields) for e in _run(JOINED)]
    (folder / EVENTS_FILE).write_text("".join(lines))
    return folder


def test_the_json_report_holds_each_stretch_and_its_nodes_spans(tmp_path, capsys) -> None:
    assert run_report(_logs(tmp_path / "logs"), None, as_json=True) == 0
    (stretch,) = json.loads(capsys.readouterr().out)["reduced"]
    assert {k: stretch[k] for k in ("generation", "start", "end", "ranks", "world")} == {
        "generation": 1,
        "start": 11.5,
        "end": 40.0,
        "ranks": 3,
        "world": 4,
    }
    assert stretch["reduced_throughput_s"] == pytest.approx(7.125)
    assert stretch["until"] == "full size again"
    assert [(n["agent"], n["kept"], n["joined"]) for n in stretch["nodes"]] == [
        ("a", [0, 2, 3], [1]),
        ("b", [0, 2, 3], []),
    ]


def test_the_timeline_draws_each_nodes_reduced_span_on_its_lane(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from rtrain.cli.render.report import draw_report

    report = build_report(_run(JOINED))
    bars = reduced_bars(report)
    assert [(y, start) for y, start, _ in bars] == [(0, 11.5), (1, pytest.approx(11.6))]
    assert [length for *_, length in bars] == [pytest.approx(28.5), pytest.approx(28.2)]
    png, svg = draw_report(report, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ids = {e.get("id") for e in ElementTree.parse(svg).getroot().iter()}
    assert {"reduced-0", "reduced-1"} <= ids and "reduced-2" not in ids
    assert "reduced size" in svg.read_text()  # the legend's entry
    png, svg = draw_report(build_report(_run([])), tmp_path)
    ids = {e.get("id") or "" for e in ElementTree.parse(svg).getroot().iter()}
    assert not any(i.startswith("reduced-") for i in ids)
