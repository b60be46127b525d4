"""The wall time by cause from a real job (core/observe/badput/): a worker crashes in
generation 0 (a restart), stops itself (SIGSTOP) in generation 1 (a hang, found by
--hang-timeout: its wait), and generation 2 finishes. `rtrain report --json` puts
every second of the wall time to one cause, and the node's --metrics-file counts the
same causes as `rtrain_job_seconds_total{cause}`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import ROOT, RTRAIN, events_under, probe_env, run

pytestmark = pytest.mark.integration

HANG_TIMEOUT = 2.0
# Beats and snapshots 1 MiB once a step; rank 1 exits at step 15 of generation 0 and
# stops itself at step 15 of generation 1 (rank 0 then blocks in its all-reduce: a victim).
SCRIPT = """
import os, signal, sys, time
import torch, torch.distributed as dist
import rtrain
from rtrain.core import heartbeat
dist.init_process_group("gloo")
state = {"w": torch.ones(1 << 18)}
generation = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = dist.get_rank()
for step in range(40):
    if step == 15 and rank == 1 and generation == 0:
        sys.exit(3)
    if step == 15 and rank == 1 and generation == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
    rtrain.snapshot(state, step)
    heartbeat(step)
    time.sleep(0.05)
dist.destroy_process_group()
"""


def test_a_crash_and_a_hang_split_the_wall_time_by_cause(tmp_path: Path) -> None:
    script = tmp_path / "crash_then_hang.py"
    script.write_text(SCRIPT)
    logs, metrics = tmp_path / "logs", tmp_path / "node.prom"
    args = [
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=2",
        f"--hang-timeout={HANG_TIMEOUT:g}",
        f"--log-dir={logs}",
        f"--metrics-file={metrics}",
    ]
    done = run([*RTRAIN, *args, str(script)], probe_env(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    kinds = {(e.generation, e["kind"]) for e in events_under(logs, "fault")}
    assert {(0, "exit"), (1, "hang")} <= kinds, kinds
    report = subprocess.run(
        [sys.executable, "-m", "rtrain.cli.main", "report", str(logs), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    badput = data["badput"]
    seconds = badput["seconds"]
    assert sum(seconds.values()) == pytest.approx(data["wall_s"], rel=0.01)
    assert badput["wall_s"] == pytest.approx(data["wall_s"], rel=1e-9)
    for cause in ("startup", "training", "restart", "hang_wait", "restore", "snapshot_overhead"):
        assert seconds[cause] > 0, (cause, seconds)
    # the hang's wait: from the last heartbeat step to the end --hang-timeout found
    assert HANG_TIMEOUT * 0.75 <= seconds["hang_wait"] <= HANG_TIMEOUT + 5, seconds
    assert seconds["repair"] == seconds["reduced_size"] == seconds["straggler"] == 0
    assert badput["goodput"] == pytest.approx(seconds["training"] / data["wall_s"])
    assert badput["timeline"][0]["cause"] == "startup"

    # the node's own counters, written at its job_end: the same split of its time
    counted = {
        s.labels["cause"]: s.value
        for family in text_string_to_metric_families(metrics.read_text())
        for s in family.samples
        if s.name == "rtrain_job_seconds_total"
    }
    (node,) = badput["nodes"].values()
    assert counted.keys() == node.keys()
    assert sum(counted.values()) == pytest.approx(sum(node.values()), rel=0.01), [
        (c, counted[c], node[c]) for c in node
    ]
    for cause in ("startup", "training", "restart", "hang_wait"):
        assert counted[cause] == pytest.approx(node[cause], abs=0.5), (counted, node)
