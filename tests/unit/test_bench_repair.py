"""scripts/bench_repair.py: how a run is judged from the worker's files (the first step
begun after the fault, whether the survivor kept its process) and its command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_repair import judge, spec, summarize

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_repair.py"


def _write(out: Path, pid: int, rows: list[tuple[float, float, int]]) -> None:
    lines = "".join(f"{began} {ended} {step}\n" for began, ended, step in rows)
    (out / f"steps_{pid}.txt").write_text(lines)


def test_nothing_is_judged_before_the_fault_or_before_a_step_after_it(tmp_path: Path) -> None:
    _write(tmp_path, 10, [(100.0, 100.1, 0)])
    assert judge(tmp_path) is None
    (tmp_path / "fault.json").write_text(json.dumps({"t_fault": 100.5, "step": 1}))
    assert judge(tmp_path) is None


def test_a_step_under_way_at_the_fault_does_not_count(tmp_path: Path) -> None:
    (tmp_path / "fault.json").write_text(json.dumps({"t_fault": 100.5, "step": 2}))
    _write(tmp_path, 10, [(100.0, 100.2, 0), (100.2, 100.4, 1), (100.45, 100.6, 2)])
    assert judge(tmp_path) is None  # step 2 began before the fault
    _write(tmp_path, 11, [(101.0, 101.3, 2)])  # a new process's first step
    outcome = judge(tmp_path)
    assert outcome is not None
    assert outcome.recovery == pytest.approx(0.8)
    assert not outcome.kept
    assert outcome.step_s == pytest.approx(0.2)


def test_a_survivor_that_keeps_its_process_is_seen(tmp_path: Path) -> None:
    (tmp_path / "fault.json").write_text(json.dumps({"t_fault": 100.5, "step": 2}))
    _write(tmp_path, 10, [(100.0, 100.2, 0), (100.6, 100.9, 2)])
    _write(tmp_path, 12, [(100.6, 100.8, 2)])  # the replaced rank's first step ends first
    outcome = judge(tmp_path)
    assert outcome is not None and outcome.kept
    assert outcome.recovery == pytest.approx(0.3)
    assert summarize({"repair": [outcome]})[0]["kept"] == 1


def test_a_peer_that_is_not_installed_is_said_so() -> None:
    assert spec("torchft", None).missing.startswith("not installed")
    assert spec("ft_launcher", Path("/nonexistent")).missing.startswith("not installed")


def test_an_unknown_launcher_is_refused_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--launchers", "slurm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 64
    assert run.stderr.strip().startswith("bench_repair: unknown launcher(s) slurm")
