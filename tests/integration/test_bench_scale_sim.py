"""bench_scale.py sim at a size CI affords: 8 simulated agents over a real TCPStore,
their checks on the shard's loop, one silenced; the survivors find it and commit the
next generation, and the figures the report needs are there (the simulator's own CPU
and lateness included)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


def test_eight_simulated_agents_find_a_silent_loss_and_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench_scale_sim

    monkeypatch.setattr(bench_scale_sim, "WINDOW_S", 1.0)
    monkeypatch.setattr(bench_scale_sim, "AGENTS_PER_SHARD", 4)  # two processes
    [result] = bench_scale_sim.simulate([8], ["c10d"])
    assert "error" not in result, result
    assert result["processes"] == 2
    # one to three of the victim's watchers (each agent watches 3 peers) saw its lease
    # expire before the fence reached them; the next generation lost it and nobody else
    assert 1 <= int(result["declared_by"]) <= 3  # type: ignore[call-overload]
    assert result["next_generation_sizes"] == [7]
    assert 4.0 <= float(result["detect_s"]) <= 9.0  # the 5 s lease  # type: ignore[arg-type]
    assert float(result["commit_after_declared_s"]) < 5.0  # type: ignore[arg-type]
    assert float(result["requests_per_agent_s"]) > 0  # type: ignore[arg-type]
    assert int(result["bytes_per_generation"]) > 0  # type: ignore[call-overload]
    for figure in ("simulator_cpu_pct", "store_server_cpu_pct_per_agent", "loop_late_window"):
        assert figure in result


def test_hot_spares_cost_no_more_than_a_running_agent_and_the_first_is_let_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench_scale_sim

    monkeypatch.setattr(bench_scale_sim, "WINDOW_S", 2.0)
    monkeypatch.setattr(bench_scale_sim, "AGENTS_PER_SHARD", 8)
    [result] = bench_scale_sim.simulate([8], ["c10d"], spares=3)
    assert "error" not in result, result
    spare = float(result["spare_requests_per_spare_s"])  # type: ignore[arg-type]
    assert spare <= float(result["requests_per_agent_s"])  # type: ignore[arg-type]
    assert float(result["spare_admitted_after_declared_s"]) < 5.0  # type: ignore[arg-type]
    assert float(result["commit_after_declared_s"]) < 5.0  # type: ignore[arg-type]
