"""Every figure a user sees right (issue 48 item 5), each from a real run: real `rtrain
launch` processes, the figures read from their events, `rtrain status --json` and the
report built from the events (core/observe/report.py), the log lines where the log is
the figure.

- a job that failed before its first step: goodput 0, not 97.6 %, a wall time from the
  first event (it ended before its own incident), no step or step time;
- one node that repaired in place: the picture says snapshots were taken and one was
  restored (it said "no snapshots taken"), `rtrain status` says not replicated (it said
  "replicated N": nothing is held elsewhere without a peer), the log says "repairing in
  place" and "started 1 worker, kept 1 alive" (it said "restarting the job", "started 2
  workers"), the recovery table "1 failure; 2 generations ran" (it said "1 fault(s) in 1
  generation(s)"), and the job's last line says it succeeded (steps, wall time, faults
  survived, the report command).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtrain.cli.render.report import no_replication
from rtrain.core.observe.report import build_report
from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, RTRAIN, events_under, probe_env, run

pytestmark = pytest.mark.integration

REPAIRABLE = str(ROOT / "tests" / "scripts" / "train_repairable.py")
STATUS = [sys.executable, "-m", "rtrain.cli.main", "status"]

NEVER_STEPS = """
import time
import rtrain  # heartbeats, had it stepped
time.sleep(1.5)
raise SystemExit(3)
"""


def test_a_job_that_failed_before_its_first_step_kept_nothing(tmp_path: Path) -> None:
    script = tmp_path / "never_steps.py"
    script.write_text(NEVER_STEPS)
    logs = tmp_path / "logs"
    args = ["--standalone", "--nproc-per-node=1", f"--log-dir={logs}", str(script)]
    done = run([*RTRAIN, *args], probe_env(tmp_path), timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    (end,) = events_under(logs, "generation_end")
    assert end["reached_step"] is None  # the zeroed heartbeat file said step 0
    report = build_report(events_under(logs))
    assert report.goodput == 0.0  # it said 97.6 %: its generation counted as training
    assert report.final_step is None and report.step_s is None  # it said step 0, 2 s/step
    # every time from the first event: the wall time covers the incident and its tail
    assert all(row.t <= report.wall_s for row in report.failures)
    assert report.wall_s >= max(row.t + (row.time_lost_s or 0) for row in report.failures)
    assert report.startup_s > 0 and not report.goodput_bound
    assert report.badput is not None and report.badput.seconds["training"] == 0


def _status(port: int, run_id: str) -> dict | None:
    """The job's view; None while its store does not listen yet (refused: exit 75) or
    holds no round yet."""
    argv = [*STATUS, f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", "--json"]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if shown.returncode == 75 and "connection refused" in shown.stderr:
        return None
    if shown.returncode == 1 and "no job" in shown.stderr:  # listening, no round yet
        return None
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def _snapshot_seen(cluster: LocalCluster) -> dict:
    """`rtrain status --json`'s node once it says a snapshot step was committed."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert cluster.procs[0].poll() is None, cluster.log(0)
        view = _status(cluster.port, cluster.run_id)
        nodes = view["nodes"] if view is not None else []
        if nodes and nodes[0]["committed"] is not None:
            return nodes[0]
        time.sleep(0.3)
    raise AssertionError(cluster.log(0))


def test_a_repair_in_place_on_one_node_says_what_it_did(tmp_path: Path) -> None:
    flags = ["--nproc-per-node=2", "--max-restarts=3", "--heartbeat-interval=0.5"]
    cluster = LocalCluster(
        tmp_path,
        1,
        "1",
        flags,
        script=REPAIRABLE,
        PROBE_STEPS="60",
        PROBE_STEP_SLEEP="0.1",
        PROBE_FAULT="rank=1,step=30,action=kill",
    )
    try:
        node = _snapshot_seen(cluster)
        # one node: nothing is replicated (it said "replicated N", its own step)
        assert node["replicated"] is None, node
        assert cluster.finish(180) == [0], cluster.log(0)
    finally:
        cluster.close()
    log = cluster.log(0)
    (repair,) = cluster.events("repair")
    assert repair["kept"] == [0] and repair["restarted"] == [1]
    # the log agrees with the repair event
    assert "repairing in place (1 of 3 restarts used)" in log
    assert "restarting the job" not in log
    assert "started 1 worker, kept 1 alive by the repair in place (ranks 0-1 of 2)" in log
    report = build_report(cluster.events())
    assert report.generations == 2 and len(report.failures) == 1
    # the wall time by cause: the kill's recovery was a repair in place, not a restart
    assert report.badput is not None
    assert sum(report.badput.seconds.values()) == pytest.approx(report.wall_s, rel=0.01)
    assert report.badput.seconds["repair"] > 0 and report.badput.seconds["restart"] == 0
    (restored,) = report.restored.items()
    assert restored[0] == 1 and restored[1] >= 0
    # the picture's replication panel: it said "no snapshots taken"
    note = no_replication(report)
    assert f"step {restored[1]} restored in gen 1" in note and "no snapshots" not in note
    # the recovery table's title: it said "after 1 fault(s) in 1 generation(s)"
    assert "succeeded after 1 failure; 2 generations ran" in log
    # the job's last line: the step reached, its wall time, the faults survived, the
    # command that reports it, as the node's own events say
    last = log.rstrip().splitlines()[-1]
    (run_dir,) = {str(Path(p).parent) for p in (tmp_path / "logs").rglob("events.jsonl")}
    assert last.startswith(f"rtrain: {REPAIRABLE} succeeded: reached step {report.final_step}, ")
    assert report.final_step == 59
    assert last.endswith(f", 1 fault survived over 2 generations; see: rtrain report {run_dir}")
    wall = float(last.split("reached step 59, ")[1].split(" s wall time")[0])
    assert wall == pytest.approx(report.wall_s, abs=0.05)
