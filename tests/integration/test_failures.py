"""Failures injected for real: worker crashes, restarts, signals, a SIGKILLed agent."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import psutil
import pytest

from rtrain.core.rendezvous.failures import FailureRecord
from tests.integration.helpers import PROBE, RTRAIN, events_under, probe_env, records, run

pytestmark = pytest.mark.integration


def test_crash_restarts_with_rising_restart_count(tmp_path):
    env = probe_env(tmp_path, PROBE_FAULT="rank=1,step=1,gen=0,action=exit", PROBE_STEPS="4")
    logs = f"--log-dir={tmp_path / 'logs'}"
    result = run([*RTRAIN, "--nproc-per-node=2", "--max-restarts=1", logs, PROBE], env)
    assert result.returncode == 0, result.stderr[-3000:]
    faults = events_under(tmp_path / "logs", "fault")  # rank 0 too, if it failed after
    crash = next(e for e in faults if e["rank"] == 1)
    assert (crash["kind"], crash["exitcode"], crash.generation) == ("exit", 3, 0)
    assert all(e.generation == 0 for e in faults)
    (recovery,) = events_under(tmp_path / "logs", "recovery")
    assert (recovery["from_generation"], recovery["cause"], recovery.generation) == (
        0,
        "local_failure",
        1,
    )
    starts = events_under(tmp_path / "logs", "generation_start")
    assert [(e.generation, e["world_size"]) for e in starts] == [(0, 2), (1, 2)]
    found = records(tmp_path)
    assert found[(0, 1)]["fault"] == "exit"
    for rank in (0, 1):
        after = found[(1, rank)]
        assert after["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert after["env"]["RTRAIN_GENERATION"] == "1"
        assert after["steps"] == 4


def test_init_process_group_succeeds_after_every_restart(tmp_path):
    """Five generations in a row fail after their first collective; each one initialised."""
    env = probe_env(
        tmp_path, PROBE_FAULT="rank=0,step=0,gen=0/1/2/3/4,action=raise", PROBE_STEPS="2"
    )
    result = run([*RTRAIN, "--nproc-per-node=2", "--max-restarts=5", PROBE], env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    found = records(tmp_path)
    for generation in range(5):
        # the failing rank wrote its record only after init_process_group and a collective
        assert found[(generation, 0)]["fault"] == "raise"
        assert found[(generation, 0)]["first_sum"] == 2.0
    assert found[(5, 0)]["steps"] == 2 and found[(5, 1)]["steps"] == 2
    pids = {found[(g, 0)]["pid"] for g in range(6)}
    assert len(pids) == 6  # a fresh process every generation


def test_restarts_exhausted_reports_the_root_cause(tmp_path):
    env = probe_env(tmp_path, PROBE_FAULT="rank=1,step=0,gen=0/1,action=raise")
    result = run(
        [*RTRAIN, "--nproc-per-node=2", "--max-restarts=1", f"--log-dir={tmp_path}/logs", PROBE],
        env,
    )
    assert result.returncode == 1
    assert "train_probe.py FAILED" in result.stderr
    assert "root cause" in result.stderr
    assert "RuntimeError: injected failure at step 0" in result.stderr
    assert "max_restarts=1 exhausted" in result.stderr
    assert "Traceback of rank 1" in result.stderr
    error_files = list((tmp_path / "logs").glob("*/attempt_1/1/error.json"))
    assert len(error_files) == 1


def test_killed_worker_is_reported_by_signal(tmp_path):
    env = probe_env(tmp_path, PROBE_FAULT="rank=0,step=1,gen=0,action=kill")
    result = run([*RTRAIN, "--nproc-per-node=2", PROBE], env)
    assert result.returncode == 1
    assert "SIGKILL (-9)" in result.stderr


def _start_long_job(
    tmp_path, *flags: str, **env_extra: str
) -> tuple[subprocess.Popen, list[psutil.Process]]:
    env = probe_env(tmp_path, **{"PROBE_STEPS": "100000", "PROBE_STEP_SLEEP": "0.05", **env_extra})
    agent = subprocess.Popen(
        [*RTRAIN, "--nproc-per-node=2", *flags, PROBE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    workers: list[psutil.Process] = []
    while time.monotonic() < deadline:
        tree = psutil.Process(agent.pid).children(recursive=True)
        # the zygote and its two workers (the workers' parent is the zygote)
        workers = [p for p in tree if p.ppid() != agent.pid]
        if len(workers) == 2:
            return agent, workers
        time.sleep(0.05)
    agent.kill()
    raise AssertionError("workers did not start")


def test_sigkill_of_the_agent_leaves_no_worker_alive(tmp_path):
    agent, workers = _start_long_job(tmp_path)
    time.sleep(1.0)  # let them get into training
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    _, alive = psutil.wait_procs(workers, timeout=2.0)
    assert not alive, f"workers survived their agent: {[p.pid for p in alive]}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_everything_and_exits_128_plus_it(tmp_path, sig):
    """torchrun's exit codes (143, 130, 129); no process of the job is left, and the
    agent's memory-backed folder (heartbeats, snapshot slots) is gone."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    agent, _ = _start_long_job(tmp_path, RTRAIN_RUNTIME_DIR=str(runtime))
    tree = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
    assert list(runtime.glob("rtrain-run-*")), "the agent has no runtime folder"
    started = time.monotonic()
    agent.send_signal(sig)
    code = agent.wait(timeout=30)
    assert code == 128 + sig
    assert time.monotonic() - started < 5
    _, alive = psutil.wait_procs(tree, timeout=2.0)
    assert not alive, [p.pid for p in alive]
    assert list(runtime.glob("rtrain-run-*")) == []
    assert f"received {signal.Signals(sig).name}" in agent.stderr.read()


def test_worker_ignoring_sigterm_is_killed_after_shutdown_timeout(tmp_path):
    agent, workers = _start_long_job(tmp_path, "--shutdown-timeout=2", PROBE_IGNORE_SIGTERM="1")
    time.sleep(1.0)
    started = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    code = agent.wait(timeout=30)
    elapsed = time.monotonic() - started
    assert code == 128 + signal.SIGTERM
    assert 2.0 <= elapsed < 6.0, elapsed
    _, alive = psutil.wait_procs(workers, timeout=1.0)
    assert not alive


def test_killed_worker_pool_is_a_worker_failure_and_restarts(tmp_path):
    """SIGKILL of the zygote takes its workers down; the agent restarts a new pool."""
    agent, workers = _start_long_job(tmp_path, "--max-restarts=1", PROBE_STEPS="60")
    time.sleep(1.0)
    zygote = psutil.Process(workers[0].ppid())
    zygote.send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs(workers, timeout=2.0)
    assert not alive
    code = agent.wait(timeout=90)
    stderr = agent.stderr.read()
    assert code == 0, stderr[-3000:]
    assert "restarting the job (1 of 1 restarts used)" in stderr
    assert "starting a new one" in stderr  # the pool was replaced
    found = records(tmp_path)
    assert found[(1, 0)]["steps"] == 60 and found[(1, 1)]["steps"] == 60


def _failure_report(log_dir) -> list[dict]:
    (path,) = log_dir.glob("*/failures.json")
    return json.loads(path.read_text())


def test_the_report_lists_the_root_cause_then_every_other_rank_that_ended_non_zero(tmp_path):
    """As torchrun's FAILED summary: rank 0, which ignores SIGTERM and fails in its next
    collective (or is killed), is listed after the root cause, which says "exit 3"."""
    env = probe_env(
        tmp_path, PROBE_FAULT="rank=1,step=1,gen=0,action=exit", PROBE_IGNORE_SIGTERM="1"
    )
    logs = tmp_path / "logs"
    result = run([*RTRAIN, "--nproc-per-node=2", f"--log-dir={logs}", PROBE], env)
    assert result.returncode == 1, result.stderr[-3000:]
    report = _failure_report(logs)
    assert (report[0]["rank"], report[0]["exitcode"], report[0]["kind"]) == (1, 3, "exit")
    assert [r["rank"] for r in report] == [1, 0]
    assert report[1]["exitcode"] != 0
    root = FailureRecord.decode(json.dumps(report[0]))
    # the worker's sys.exit(3), recorded by the worker as it began to exit
    assert root.summary() == "sys.exit(3)"
    assert "train_probe.py" in root.traceback and "sys.exit(3)" in root.traceback
    assert "sys.exit(3)" in result.stderr  # the table shows the summary
