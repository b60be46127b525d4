"""`rtrain plan` end to end: the table, the timeline picture, the JSON action list, and
bad input as one line with exit 64."""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.helpers import ROOT, error_lines, run

PLAN = [sys.executable, "-m", "rtrain.cli.main", "plan"]


def plan(dp: int, pp: int, microbatches: int, *args: str):
    """rtrain plan on a DP x PP job, with a wide console for the table."""
    job = ["--dp", str(dp), "--pp", str(pp), "--microbatches", str(microbatches)]
    return run([*PLAN, *job, *args], {"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_the_table_and_the_timeline(tmp_path) -> None:
    picture = tmp_path / "timeline.svg"
    done = plan(4, 4, 8, "--fail", "1:2", "--fail", "3:0", "--timeline", str(picture))
    assert done.returncode == 0, done.stderr
    for row in ("fault-free (1F1B)", "ReCycle (adaptive)", "drop replicas", "restart from"):
        assert row in done.stdout
    svg = picture.read_text()
    assert svg.startswith("<svg") and svg.count("failed</text>") == 2
    assert svg.count('fill="#4c78a8" stroke') == 4 * 4 * 8 * 2  # every F, two iterations
    # the same timeline as a PNG beside it, and a table that says what its figures mean
    png = picture.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "in the unit of the durations" in done.stdout and "in %" in done.stdout


def test_json_is_a_per_rank_action_list() -> None:
    done = plan(2, 2, 2, "--fail", "1:1", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["failed"] == [[1, 1]] and len(data["workers"]) == 3
    helper = next(w for w in data["workers"] if w["worker"] == [0, 1])
    rerouted = [a for a in helper["actions"] if a["op"] == "F" and a["replica"] == 1]
    assert len(rerouted) == 2 * 2  # replica 1's two micro-batches, two iterations
    assert all(a["recv_from"] == [1, 0] and a["send_to"] is None for a in rerouted)


def test_more_failures_than_a_stage_can_absorb_says_so(tmp_path) -> None:
    done = plan(2, 2, 2, "--fail", "0:1", "--fail", "1:1", "--timeline", str(tmp_path / "t.svg"))
    assert done.returncode == 0
    assert "stage 1 lost all 2 of its workers" in done.stdout
    assert "restart from checkpoint" in done.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dp", "0", "--pp", "2", "--microbatches", "2"], "dp must be a positive integer"),
        (["--dp", "2", "--pp", "2", "--microbatches", "2", "--fail", "x"], "REPLICA:STAGE"),
        (["--dp", "2", "--pp", "2", "--microbatches", "2", "--fail", "5:0"], "outside DP=2"),
        (["--dp", "2", "--pp", "2", "--microbatches", "2", "--forward", "-1"], "forward[0]"),
        (["--dp", "2", "--pp", "2", "--microbatches", "2", "--memory", "0"], "memory limit 0"),
        (["--dp", "2", "--pp", "2"], "--microbatches"),
    ],
)
def test_bad_input_is_one_line_and_64(args, fragment) -> None:
    done = run([*PLAN, *args], {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(error_lines(done.stderr)) == 1 and fragment in done.stderr
    assert "Traceback" not in done.stderr


def test_a_profile_file_gives_the_durations(tmp_path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps({"forward": [1, 2], "backward_input": 1, "backward_weight": 1, "optimizer": 0.1})
    )
    done = plan(2, 2, 4, "--profile", str(profile), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["iteration_time"] > 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"forward": "fast"}')
    refused = plan(2, 2, 4, "--profile", str(bad))
    assert refused.returncode == 64 and "profile" in refused.stderr
    assert ROOT.exists()


def test_exact_json_stays_pure_json() -> None:
    pytest.importorskip("scipy")
    done = plan(2, 2, 2, "--fail", "1:0", "--exact", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["failed"] == [[1, 0]]  # the solver's chatter went to stderr


def _without_matplotlib(tmp_path) -> dict[str, str]:
    """An environment whose `import matplotlib` fails, as without the `plan` extra."""
    fake = tmp_path / "no-matplotlib" / "matplotlib"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    return {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake.parent)}


def test_the_suffix_picks_the_format(tmp_path) -> None:
    picture = tmp_path / "x.png"
    done = plan(2, 2, 2, "--fail", "1:1", "--timeline", str(picture))
    assert done.returncode == 0, done.stderr
    assert picture.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not picture.with_suffix(".svg").exists()
    job = ["--dp", "2", "--pp", "2", "--microbatches", "2", "--fail", "1:1"]
    # without matplotlib: a PNG is one line and 64, and nothing is written under its name
    bare = tmp_path / "bare.png"
    done = run([*PLAN, *job, "--timeline", str(bare)], _without_matplotlib(tmp_path))
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(error_lines(done.stderr)) == 1 and "rtrain[plan]" in done.stderr
    assert "Traceback" not in done.stderr and not bare.exists()
    # an SVG still works there, saying the PNG beside it was not drawn
    svg = tmp_path / "bare.svg"
    done = run([*PLAN, *job, "--timeline", str(svg)], _without_matplotlib(tmp_path))
    assert done.returncode == 0, done.stderr
    assert svg.read_text().startswith("<svg") and not svg.with_suffix(".png").exists()
    # any other suffix: one line, 64
    done = plan(2, 2, 2, "--fail", "1:1", "--timeline", str(tmp_path / "x.jpg"))
    assert done.returncode == 64 and ".svg or .png" in done.stderr
