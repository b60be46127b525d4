"""What rtrain says, each message reproduced with a real command (issue 48 item 7): a
join timeout's error is one line, not one error nested in another; a refused connection
says refused, not "no answer"; `rtrain status` of a job whose store is gone answers at
once; `rtrain health --help` is whole at 80 columns; `--dry-run` on a node without a
driver says there will be no GPU checks. (The line that says a job succeeded:
tests/integration/test_figures.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import PROBE, ROOT, RTRAIN, HeldPort, error_lines, probe_env, run

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "rtrain.cli.main"]
NO_DRIVER = str(ROOT / "tests" / "scenarios" / "no_driver.json")


def test_a_join_timeout_on_a_refused_store_says_refused_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    with HeldPort() as port:  # held, never listening: every connection is refused
        args = [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port.port}",
            "--rdzv-id=refused",
            "--rdzv-conf=join_timeout=11,is_host=false",
            str(script),
        ]
        done = run([*RTRAIN, *args], probe_env(tmp_path), timeout=90)
    assert done.returncode == 75, done.stderr
    (error,) = error_lines(done.stderr)
    # it said "... within 11s (cannot reach ... within 0.1s (Connection refused))"
    assert error.count("cannot reach") == 1 and error.count("(") == 1, error
    assert error.endswith("within 11s: connection refused (nothing listens on that port)")
    (waiting,) = [ln for ln in done.stderr.splitlines() if "waiting for the rendezvous" in ln]
    assert "connection refused" in waiting and "no answer" not in waiting, waiting


def test_status_of_a_job_whose_store_is_gone_answers_at_once() -> None:
    with HeldPort() as port:  # the store of a finished job: gone, the port refuses
        began = time.monotonic()
        argv = [*CLI, "status", f"--rdzv-endpoint=127.0.0.1:{port.port}", "--rdzv-id=done"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        took = time.monotonic() - began
    assert done.returncode == 75 and done.stdout == ""
    (error,) = error_lines(done.stderr)
    assert "connection refused" in error and "the job has ended" in error, error
    assert took < 4, took  # it waited out --timeout (5 s) first


def test_health_help_is_whole_at_80_columns() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [*CLI, "health", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout  # it showed "--max-uncorrected-…", "CUDA_VISIBLE_DEVIC…"
    for flag in ("--max-uncorrected-ecc", "--expect-gpus", "--fake-nvml", "--xid-wait"):
        assert flag in done.stdout
    assert "CUDA_VISIBLE_DEVICES" in " ".join(done.stdout.split())


def test_a_dry_run_without_a_driver_promises_no_gpu_checks(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    env = {**os.environ, "RTRAIN_FAKE_NVML": NO_DRIVER, "COLUMNS": "200"}
    args = ["--dry-run", "--standalone", "--nproc-per-node=1", str(script)]
    done = run([*RTRAIN, *args], env)
    assert done.returncode == 0, done.stderr
    (row,) = [ln for ln in done.stdout.splitlines() if "GPU health" in ln]
    assert "no GPU checks: no NVIDIA driver on this node" in row, row
    assert "every 10s" not in row  # it promised "every check every 10s"


def test_a_job_a_fault_ended_names_what_would_have_kept_it_going(tmp_path: Path) -> None:
    # torchrun's default: no restart; rank 1 exits 1 at its first step
    args = ["--standalone", "--nproc-per-node=2", PROBE]
    env = probe_env(tmp_path, PROBE_FAULT="rank=1,step=0,gen=0,action=exit", PROBE_STEPS="3")
    done = run([*RTRAIN, *args], env, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    last = " ".join(done.stderr.strip().splitlines()[-3:])  # the very last lines
    for remedy in ("--max-restarts=N", "this run: 0", "rtrain.snapshot()", "@rtrain.repairable"):
        assert remedy in last, last
