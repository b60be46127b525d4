"""Slow ranks found and worked around (issue 49), with real agents on two localhost
nodes (one worker each) over gloo: rank 1, on node 1, sleeps for each logical rank it
holds. Node 0's agent finds it from the figures both nodes publish, node 1's agent
says so (a `straggler` event, `rtrain status`), and under --stragglers=balance the
ranks move logical ranks off it together; the training ends bitwise equal to the run
without a slow rank, and that run finds no straggler."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rtrain.core.errors import ExitCode
from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, probe_env, run_torchrun

SCRIPT = str(ROOT / "tests" / "scripts" / "train_straggler.py")
THROUGH = str(ROOT / "tests" / "scripts" / "train_through.py")
STATUS = [sys.executable, "-m", "rtrain.cli.main", "status"]
FLAGS = ["--nproc-per-node=1", "--max-restarts=0", "--heartbeat-interval=0.5"]
# 4 logical ranks a worker; every rank's work 10 ms a logical rank, rank 1's 30 ms
ENV = {"RTRAIN_MICRO_BATCHES": "4", "PROBE_WORK_S": "0.01", "PROBE_STEPS": "200"}


def _start(tmp: Path, mode: str, **env: str) -> LocalCluster:
    flags = [*FLAGS, f"--stragglers={mode}"]
    return LocalCluster(tmp, 2, "2", flags, script=SCRIPT, **{**ENV, **env})


def _finish(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    codes = cluster.finish(120)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return {r: json.loads((cluster.out / f"final_rank{r}.json").read_text()) for r in (0, 1)}


def _held(cluster: LocalCluster, rank: int) -> list[int]:
    """How many logical ranks the rank held at each step."""
    path = cluster.out / f"steps_rank{rank}.jsonl"
    return [len(json.loads(line)["logical"]) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def unslowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Any]]:
    """The run without a slow rank: its digest, and its straggler events."""
    cluster = _start(tmp_path_factory.mktemp("unslowed"), "detect")
    finals = _finish(cluster)
    assert finals[0]["digest"] == finals[1]["digest"]
    return finals[0]["digest"], cluster.events("straggler")


def test_a_job_without_a_slow_rank_finds_no_straggler(unslowed: tuple[str, list[Any]]) -> None:
    assert unslowed[1] == []


def test_a_slow_rank_is_found_shown_and_balanced_to_the_same_result(
    tmp_path: Path, unslowed: tuple[str, list[Any]]
) -> None:
    cluster = _start(tmp_path, "balance", PROBE_SLOW_RANK="1", PROBE_SLOW_S="0.02")
    try:
        shown = _status_stragglers(cluster)
    finally:
        finals = _finish(cluster)
    assert [(s["rank"], s["node"]) for s in shown] == [(1, 1)]
    (event,) = cluster.events("straggler")
    assert (event["rank"], event.node) == (1, 1)  # named by its own node's agent
    assert event["slower"] > 1.5 and event["since"] <= event.t
    assert event["wait_s"] < event["peers_wait_s"]  # the other rank waited for it
    assert event["gpu"] is None  # no NVML here
    # it held 4 logical ranks, then fewer; its peer more; the global batch kept
    slow, fast = _held(cluster, 1), _held(cluster, 0)
    assert slow[0] == 4 and slow[-1] < 4 and fast[-1] == 8 - slow[-1]
    assert all(a + b == 8 for a, b in zip(slow, fast, strict=True))  # switched together
    assert finals[0]["digest"] == finals[1]["digest"] == unslowed[0]


def _status_stragglers(cluster: LocalCluster) -> list[dict[str, Any]]:
    """`rtrain status --json`'s stragglers, once it names one (the job running)."""
    argv = [*STATUS, f"--rdzv-endpoint=127.0.0.1:{cluster.port}", f"--rdzv-id={cluster.run_id}"]
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, cluster.log(0) + cluster.log(1)
        if cluster.progress() > 0:
            shown = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
            if shown.returncode == 0 and json.loads(shown.stdout)["stragglers"]:
                return list(json.loads(shown.stdout)["stragglers"])
        time.sleep(0.5)


def test_the_script_runs_unchanged_under_torchrun_to_the_same_result(
    tmp_path: Path, unslowed: tuple[str, list[Any]]
) -> None:
    """RTRAIN_MICRO_BATCHES means the same under torchrun: each rank its micro-batches."""
    out = tmp_path / "out"
    env = probe_env(out, **{**ENV, "PROBE_WORK_S": "0"})
    result = run_torchrun(["--standalone", "--nproc-per-node=2", SCRIPT], env, 120)
    assert result.returncode == 0, result.stderr[-3000:]
    finals = [json.loads((out / f"final_rank{r}.json").read_text()) for r in (0, 1)]
    assert {rec["digest"] for rec in finals} == {unslowed[0]}


def test_a_balanced_job_trains_through_a_fault_to_the_same_result(tmp_path: Path) -> None:
    """Balancing and train-through together: rank 1 is slow and given fewer logical
    ranks; rank 0 is killed, rank 1 trains on alone with every logical rank while the
    replacement starts, the two go on with even shares, and the balancing starts again
    in the new generation. The result is torchrun's without a fault or a slow rank."""
    env = {"PROBE_STEPS": "500", "RTRAIN_MICRO_BATCHES": "2"}
    reference = probe_env(tmp_path / "reference", **env, PROBE_STEP_SLEEP="0")
    result = run_torchrun(["--standalone", "--nproc-per-node=2", THROUGH], reference, 120)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads((tmp_path / "reference" / "final_rank0.json").read_text())
    (tmp_path / "run").mkdir()
    cluster = LocalCluster(
        tmp_path / "run",
        1,
        "1",
        ["--nproc-per-node=2", "--max-restarts=3", "--stragglers=balance"],
        script=THROUGH,
        PROBE_STEP_SLEEP="0.005",
        PROBE_STARTUP_S="1",
        PROBE_SLOW_RANK="1",
        PROBE_SLOW_S="0.01",
        PROBE_FAULT="rank=0,step=300,action=kill",
        **env,
    )
    codes = cluster.finish(180)
    assert codes == [0], cluster.log(0)
    lines = [json.loads(x) for x in (cluster.out / "steps_rank1.jsonl").read_text().splitlines()]
    held = [(x["generation"], x["world"], len(x["logical"])) for x in lines]
    assert (0, 2, 1) in held  # balanced: 1 of the 4 logical ranks
    assert (1, 1, 4) in held  # alone while the replacement starts: all 4
    assert held[-1][:2] == (1, 2)  # the replacement joined
    for rank in (0, 1):
        ours = json.loads((cluster.out / f"final_rank{rank}.json").read_text())
        assert ours["digest"] == final["digest"]


def test_a_lasting_straggler_s_node_leaves_and_a_standby_takes_its_place(
    tmp_path: Path, unslowed: tuple[str, list[Any]]
) -> None:
    """--replace-stragglers-after=2: node 1's rank stays slow, so node 1 leaves the job as
    for a GPU fault (a `slow_node` fault, exit 77) and the standby takes its place; the
    job trains on to the result of the run without a slow rank."""
    flags = [*FLAGS, "--stragglers=detect", "--replace-stragglers-after=2"]
    slow = {1: {"PROBE_SLOW_RANK": "1", "PROBE_SLOW_S": "0.02"}}
    cluster = LocalCluster(tmp_path, 2, "2", flags, script=SCRIPT, node_env=slow, **ENV)
    try:
        cluster.start_standby(2, "2", flags)
        codes = cluster.wait_some([0, 1, 2], 180)
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1) + cluster.log(2)
    assert codes == [0, ExitCode.NODE_UNHEALTHY, 0], logs
    (straggler,) = [e for e in cluster.events("straggler") if e.generation == 0]
    assert (straggler["rank"], straggler.node) == (1, 1)
    (left,) = [e for e in cluster.events("fault") if e["kind"] == "slow_node"]
    assert left.node == 1 and left.t - straggler["since"] >= 2
    starts = [e for e in cluster.events("generation_start") if e.generation == 1]
    assert starts and "127.0.0.3" in starts[0]["members"]
    finals = [json.loads((cluster.out / f"final_rank{r}.json").read_text()) for r in (0, 1)]
    assert finals[0]["digest"] == finals[1]["digest"] == unslowed[0]
