"""Warm spares (rtrain launch --spares-per-node): a spare worker runs the script's
start-up ahead of any fault and takes a failed rank's place, so the job is at full size
again in the time of a state copy and a regroup, not of a cold start. Real agents on two
localhost nodes, real workers over gloo, a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtrain.core.contract.repair_files import PARKED, STATE_FILE, decode_state
from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, probe_env
from tests.integration.test_train_through import (
    FLAGS,
    NEXT_STEP_S,
    SCRIPT,
    STEPS,
    _finals,
    _steps,
    through_reference,
)

STARTUP_S = 8.0  # every new process's cold start, the spares' included


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return through_reference(tmp_path_factory)


def _cluster(tmp: Path, flags: list[str]) -> LocalCluster:
    """Two nodes of two train-through workers, each new process's start-up STARTUP_S."""
    return LocalCluster(
        tmp,
        2,
        "2",
        flags,
        conf="join_timeout=60",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        PROBE_STARTUP_S=str(STARTUP_S),
        PROBE_STEP_SLEEP="0.08",
    )


def _parked(cluster: LocalCluster, agent: str) -> list[int]:
    """The pids of the spares `agent` (a node's address) started that are parked at the
    function's entry (their state files, in the control folders their events name)."""
    found = []
    for event in cluster.events("spare_started"):
        path = os.path.join(event["folder"], STATE_FILE)
        said = decode_state(Path(path).read_bytes()) if os.path.exists(path) else None
        if event.agent == agent and said is not None and said.state == PARKED:
            found.append(int(event["pid"]))
    return found


def _wait_parked(cluster: LocalCluster, agent: str, count: int, deadline: float) -> list[int]:
    while len(found := _parked(cluster, agent)) < count:
        assert time.monotonic() < deadline, cluster.log(0)
        time.sleep(0.1)
    return found


def test_a_warm_spare_takes_the_failed_rank_without_a_cold_start(
    tmp_path: Path, reference: str
) -> None:
    cluster = _cluster(tmp_path, [*FLAGS, "--spares-per-node=1"])
    try:
        (spare,) = _wait_parked(cluster, "127.0.0.1", 1, time.monotonic() + 90)
        victim = _steps(cluster, 1)[-1]["pid"]
        t_fault = time.time()
        os.kill(victim, signal.SIGKILL)
        codes = cluster.finish(240)
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == dict.fromkeys(
        range(4), reference
    )
    # the spare is rank 1 now; the survivors kept their processes
    assert finals[1]["pid"] == spare
    (taken,) = cluster.events("spare_taken")
    assert (taken.node, taken["rank"], taken["pid"], taken["parked"]) == (0, 1, spare, True)
    assert taken["warm_s"] >= STARTUP_S
    for rank in (0, 2, 3):
        assert {s["pid"] for s in _steps(cluster, rank)} == {finals[rank]["pid"]}
    # at full size again well before a cold start could have ended
    (full,) = [e for e in cluster.events("full_size") if e.node == 0]
    assert full["joined"] == [1] and full.generation == 1
    assert full.t - t_fault < STARTUP_S - 2, (full.t - t_fault, cluster.log(0))
    after = [s for s in _steps(cluster, 2) if s["t"] > t_fault]
    assert after[0]["t"] - t_fault < NEXT_STEP_S
    # the node started a spare again for the next fault
    assert len([e for e in cluster.events("spare_started") if e.node == 0]) == 2


def test_a_standby_whose_workers_wait_warm_takes_a_lost_node_at_once(
    tmp_path: Path, reference: str
) -> None:
    """With --spares-per-node, a standby node's workers run the script's start-up while
    it waits: node 1 killed whole, the standby's two warm spares take ranks 2 and 3."""
    flags = [*FLAGS, "--heartbeat-timeout=2", "--spares-per-node=1"]
    cluster = _cluster(tmp_path, flags)
    try:
        deadline = time.monotonic() + 90
        cluster.start_standby(2, "2", flags, timeout=90)
        warm = _wait_parked(cluster, "127.0.0.3", 2, deadline)
        t_kill = cluster.kill_node(1)
        codes = cluster.wait_some([0, 1, 2], 240)
    finally:
        cluster.close()
    assert codes == [0, -9, 0], cluster.log(0) + cluster.log(2)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == dict.fromkeys(
        range(4), reference
    )
    taken = {e["rank"]: e for e in cluster.events("spare_taken")}
    assert sorted(taken) == [2, 3] and all(e["parked"] for e in taken.values())
    assert sorted(finals[r]["pid"] for r in (2, 3)) == sorted(warm)
    # the loss seen when its lease lapses (2 s), then the job whole again at once
    (full,) = [e for e in cluster.events("full_size") if e.node == 0]
    assert full.t - t_kill < 2 + STARTUP_S - 2, (full.t - t_kill, cluster.log(0))


def test_a_spare_of_a_script_that_is_not_repairable_costs_the_job_nothing(
    tmp_path: Path,
) -> None:
    """A spare of a plain script ends at its first use of the process group (it has no
    MASTER_ADDR), with its error file: not a fault of the job, which ends as without it."""
    env = probe_env(tmp_path / "out")
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "rtrain.cli.main", "launch", "--standalone"]
    argv += ["--nproc-per-node=1", "--spares-per-node=1", f"--log-dir={logs}"]
    argv += [str(ROOT / "examples" / "train_mlp.py"), "--steps", "600"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [
        json.loads(line)
        for path in logs.rglob("events.jsonl")
        for line in path.read_text().splitlines()
    ]
    names = [e["event"] for e in events]
    assert names.count("spare_started") == 1 and "fault" not in names
    (error_file,) = logs.rglob("spares/spare0_0/error.json")
    assert "MASTER_ADDR" in json.loads(error_file.read_text())["message"]["message"]
