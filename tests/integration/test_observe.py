"""Seeing a job: a 3-node job whose worker crashes and then loses a node writes the
structured events of both, `rtrain report` turns them into a table and a timeline, and
each node's --metrics-file (and --metrics-port) is valid Prometheus text all along."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, HeldPort, error_lines

pytestmark = pytest.mark.integration

REPORT = [sys.executable, "-m", "rtrain.cli.main", "report"]
FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def samples(path: Path) -> dict[tuple[str, str], float]:
    """(metric, kind label) -> value, parsed by Prometheus' own parser."""
    return parse(path.read_text())


def scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(answer.read().decode())


def parse(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("kind", ""))] = sample.value
    return found


def test_a_crash_and_a_lost_node_as_events_a_report_and_metrics(tmp_path: Path) -> None:
    metrics = {i: tmp_path / f"node{i}.prom" for i in range(3)}
    held = HeldPort()  # nodes 1 and 2 serve on it, each on its own address; not 127.0.0.1
    port = held.port
    cluster = LocalCluster(
        tmp_path,
        3,
        "2:3",
        ["--nproc-per-node=1", "--max-restarts=1", *FAST],
        node_env={
            i: {"PET_METRICS_FILE": str(path), **({"PET_METRICS_PORT": str(port)} if i else {})}
            for i, path in metrics.items()
        },
        PROBE_STEPS="60",
        PROBE_FAULT="rank=1,step=3,gen=0,action=exit",
    )
    try:
        cluster.wait_progress(8)  # generation 1 trains after the crash
        # node 1 also serves its metrics over HTTP, on its own address only
        # the restart counts at node 1's `recovery` event: once its workers step again,
        # seen up to 0.25 s after (rank 0's progress may come first)
        url, end = f"http://127.0.0.2:{port}/metrics", time.monotonic() + 10
        scraped = scrape(url)
        while scraped[("rtrain_restarts_total", "")] < 1 and time.monotonic() < end:
            time.sleep(0.05)
            scraped = scrape(url)
        assert scraped[("rtrain_restarts_total", "")] == 1, scraped
        assert scraped.get(("rtrain_faults_total", "exit"), 0) >= 1, scraped
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.2:{port}/", timeout=10)
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        cluster.kill_node(2)
        codes = cluster.wait()
    finally:
        cluster.close()
        held.close()
    assert codes[:2] == [0, 0], cluster.log(0) + cluster.log(1)

    faults = cluster.events("fault")
    # the crash is the first exit; rank 0 may exit too, on the gloo error rank 1's exit
    # gives it, and its agent may report that first on a loaded machine
    crash = min((e for e in faults if e["kind"] == "exit"), key=lambda e: e["fault_t"])
    assert (crash["rank"], crash.generation) == (1, 0)
    (lost,) = [e for e in faults if e["kind"] == "lost_node"]
    assert lost["host"] == "127.0.0.3" and lost.generation >= 1
    survivors = {"127.0.0.1", "127.0.0.2"}
    into = {(e.agent, e.generation) for e in cluster.events("recovery")}
    assert {a for a, g in into if g == 1} >= survivors  # after the crash
    assert {a for a, g in into if g and g >= 2} >= survivors  # after the loss

    out = tmp_path / "report"
    done = subprocess.run(
        [*REPORT, str(tmp_path / "logs"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "goodput" in done.stdout and "time lost" in done.stdout
    assert (out / "rtrain-report.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "rtrain-report.svg").read_text().lstrip().startswith("<?xml")
    as_json = subprocess.run(
        [*REPORT, str(tmp_path / "logs"), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    report = json.loads(as_json.stdout)
    kinds = [row["kind"] for row in report["failures"]]
    assert kinds[0] == "exit" and "lost_node" in kinds
    rows = {row["kind"]: row for row in report["failures"]}
    assert all(0 < rows[k]["time_lost_s"] < 60 for k in ("exit", "lost_node"))
    assert 0 < report["goodput"] <= 1 and report["final_step"] == 59
    # the wall time by cause, every node's merged: every second to one cause
    causes = report["badput"]["seconds"]
    assert sum(causes.values()) == pytest.approx(report["wall_s"], rel=0.01)
    assert causes["startup"] > 0 and causes["training"] > 0 and causes["restart"] > 0

    # the survivors' metric files: two restarts each, the faults they saw
    for index in (0, 1):
        found = samples(metrics[index])
        assert found[("rtrain_restarts_total", "")] == 2
        assert found[("rtrain_generation", "")] >= 2
    seen = samples(metrics[0])
    assert (
        seen.get(("rtrain_faults_total", "lost_node"), 0)
        + samples(metrics[1]).get(("rtrain_faults_total", "lost_node"), 0)
        == 1
    )


def test_a_folder_without_events_is_one_line_and_64(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text('garbage\n{"v": 7}\n')
    done = subprocess.run([*REPORT, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 64
    assert error_lines(done.stderr) == [
        f"rtrain: error: {tmp_path}: no rtrain events (events.jsonl) under it"
    ]
    assert "Traceback" not in done.stderr
