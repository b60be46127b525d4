"""scripts/model_control_plane.py: what the model claims follows from its inputs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import model_control_plane as model


def test_per_agent_load_is_flat_and_one_tcpstore_saturates_past_2048_nodes() -> None:
    points = {(p.backend, p.nodes): p for p in model.model()}
    for nodes in model.SIZES:
        per_agent = points[("TCPStore", nodes)].requests_s / nodes
        assert per_agent == model.TCPSTORE.req_per_agent_s
    # one store host is enough at the users' 2,000 nodes, not at 12,500
    assert not points[("TCPStore", 2048)].saturated and points[("TCPStore", 2048)].commit_s < 3
    assert points[("TCPStore", 12500)].saturated
    assert 2048 < model.saturation(model.TCPSTORE) < 12500
    rack = points[("TCPStore + rack tier", 12500)]
    assert not rack.saturated and rack.commit_s < 3
    assert rack.requests_s * model.RACK <= points[("TCPStore", 12500)].requests_s + 1e-6


def test_the_plot_and_the_table_are_written(tmp_path: Path) -> None:
    png = tmp_path / "model.png"
    assert model.main(["--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
