"""scripts/bench_scale_report.py: docs/bench_scale.json as benchmarks.md's tables, the
hot spares' figures that the simulator measures included (issue 36 item 6)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_scale_report import report

PLAIN = {
    "backend": "c10d",
    "nodes": 64,
    "requests_per_agent_s": 3.33,
    "commit_after_declared_s": 0.58,
}
SPARES = {
    "backend": "c10d",
    "nodes": 64,
    "spares": 16,
    "requests_per_agent_s": 3.37,
    "spare_requests_per_spare_s": 0.6,
    "spare_requests_per_spare_s_by_op": {"multi_get": 0.4, "compare_set": 0.2},
    "spare_admitted_after_declared_s": 0.32,
    "commit_after_declared_s": 0.52,
    "spare_requests_per_spare_through_commit": 17.6,
    "load_before": 9.8,
    "load_after": 10.1,
}
NO_SPARE_IN = {**SPARES, "backend": "etcd", "error": "no spare was let in"}
del NO_SPARE_IN["spare_admitted_after_declared_s"]


def _rows(text: str, header: str) -> list[list[str]]:
    """The cells of the rows of the table whose header row contains `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if header in line)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_hot_spares_figures_have_a_table() -> None:
    text = report({"sim": [PLAIN, SPARES, NO_SPARE_IN]})
    rows = _rows(text, "spare requests / spare / s")
    assert rows == [
        [
            "64 + 16 spares",
            "c10d",
            "0.6",
            "compare_set 0.2, multi_get 0.4",
            "3.37",
            "0.32 s",
            "0.52 s",
            "17.6",
            "9.8 -> 10.1",
        ],
        [
            "64 + 16 spares",
            "etcd",
            "0.6",
            "compare_set 0.2, multi_get 0.4",
            "3.37",
            "no spare was let in",
            "0.52 s",
            "17.6",
            "9.8 -> 10.1",
        ],
    ]
    # the simulation table tells a run with spares from one without
    agents = [row[0] for row in _rows(text, "| agents | processes |")]
    assert agents == ["64", "64 + 16 spares", "64 + 16 spares"]


def test_no_spare_runs_no_spare_table() -> None:
    assert "spare requests" not in report({"sim": [PLAIN], "real": []})


def test_the_real_table_says_what_each_agent_spent_to_start() -> None:
    """Where a start's time goes: the CPU seconds of node 0's process tree and of the
    median agent's, until every worker ran."""
    real = {"backend": "c10d", "nodes": 64, "startup_s": 20.5}
    text = report({"real": [{**real, "start_cpu_s_node0": 2.1, "start_cpu_s_agent": 0.45}]})
    [row] = _rows(text, "| agents | launcher |")
    assert row[:4] == ["64", "rtrain, TCPStore", "20.5 s", "2.1 s / 0.45 s"]
