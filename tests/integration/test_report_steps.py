"""`rtrain report` counts the steps a crash made a script do again from its heartbeats,
with no snapshot to say so (issue 31 item 7: it said 'steps lost 0'): the agent's
events carry the steps its workers were seen at and when, and the report reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, RTRAIN, events_under, probe_env, run

pytestmark = pytest.mark.integration

# Beats once a step, in lockstep (an all-reduce a step); after a crash of rank 1 at
# step 41 it resumes at step 10 from a checkpoint of its own: steps 10..40 again (31).
SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
from rtrain.core import heartbeat
dist.init_process_group("gloo")
generation = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(10 if generation else 0, 60):
    if generation == 0 and step == 41 and dist.get_rank() == 1:
        sys.exit(3)
    dist.all_reduce(torch.ones(1))
    heartbeat(step)
    time.sleep(0.03)
dist.destroy_process_group()
"""


def test_steps_done_again_after_a_crash_come_from_the_heartbeats(tmp_path: Path) -> None:
    script = tmp_path / "resumes.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    args = ["--standalone", "--nproc-per-node=2", "--max-restarts=1", f"--log-dir={logs}"]
    done = run([*RTRAIN, *args, str(script)], probe_env(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ends = events_under(logs, "generation_end")
    assert [e["reached_step"] for e in ends] == [40, 59]
    assert all(e["first_seen_t"] <= e["last_beat_t"] for e in ends)
    (recovery,) = events_under(logs, "recovery")
    assert recovery["first_step"] == 10 and recovery["at_step"] >= 10
    report = subprocess.run(
        [sys.executable, "-m", "rtrain.cli.main", "report", str(logs), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    (crash,) = data["failures"]
    assert (crash["steps_lost"], crash["exact"]) == (31, True)  # it said 0
    assert 0 < crash["time_lost_s"] < 30 and data["final_step"] == 59
    assert data["step_s"] == pytest.approx(0.03, abs=0.03) and not data["goodput_bound"]
    assert data["ended"] == "succeeded (exit 0 on every node)"
