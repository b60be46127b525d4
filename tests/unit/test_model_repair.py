"""scripts/model_repair.py: the model's arithmetic (phases add up, each path pays what it
should, the communicator's cost grows with the ranks) and its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from model_repair import SCENARIOS, Assumptions, figures, markdown, phases

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_nccl_init_is_linear_through_the_published_96k_figure() -> None:
    a = Assumptions()
    assert a.nccl_init_s(96_000) == pytest.approx(a.nccl_floor_s + 265.0)
    assert a.nccl_init_s(1024) == pytest.approx(1.0 + 1024 * 265.0 / 96_000)


def test_restart_pays_every_cold_start_phase_and_repair_keeps_the_survivors_warm() -> None:
    a = Assumptions()
    restart = phases(a, "standby", "restart", 1024)
    repair = phases(a, "standby", "repair", 1024)
    for phase in ("process", "CUDA context", "data loaders", "compile"):
        assert restart[phase] > 0 and phase not in repair
    assert repair["abort"] == a.abort_s and "abort" not in restart
    assert repair["NCCL init"] == restart["NCCL init"] == a.nccl_init_s(1024)
    assert restart["state to GPU"] == pytest.approx(a.state_bytes / 1024 / a.h2d_bytes_s)


def test_a_lone_crash_costs_the_same_in_both_paths_but_the_abort() -> None:
    a = Assumptions()
    restart = sum(phases(a, "crash", "restart", 16384).values())
    repair = sum(phases(a, "crash", "repair", 16384).values())
    assert repair - restart == pytest.approx(a.abort_s)


def test_a_shrinking_world_rebuilds_over_one_node_fewer_and_reshards() -> None:
    a = Assumptions()
    repair = phases(a, "shrink", "repair", 1024)
    assert repair["NCCL init"] == pytest.approx(a.nccl_init_s(1024 - a.gpus_per_node))
    lost = a.state_bytes / 1024 * a.gpus_per_node
    assert repair["reshard"] == pytest.approx(lost / (1024 - 8) / a.peer_bytes_s)


def test_figures_total_their_phases_and_grow_with_the_job() -> None:
    rows = figures(Assumptions(), [1024, 16384])
    assert len(rows) == 2 * len(SCENARIOS)
    for row in rows:
        assert row["restart_s"] == pytest.approx(sum(row["restart"].values()))
        assert row["ratio"] == pytest.approx(row["repair_s"] / row["restart_s"])
    small, large = rows[0], rows[len(SCENARIOS)]
    assert large["restart_s"] > small["restart_s"]
    assert "| 16,384 |" in markdown(rows)


def test_an_unknown_scenario_and_a_bad_size_are_refused() -> None:
    with pytest.raises(ValueError):
        phases(Assumptions(), "meteor", "restart", 1024)
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "model_repair.py"), "--gpus", "many"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 64
    assert run.stderr.strip() == "--gpus: not a list of integers: 'many'"
