"""Train through a lost node (rtrain.repairable(train_through=True)), real agents on
localhost nodes, real workers over gloo: without a standby the kept workers take the
lost node's data shares for the rest of the job; with one (the node killed whole, or
taken out by a sick GPU) the standby's workers join when warm; and 30 faults and joins
in a row leak nothing. Every job ends bitwise equal to the run without a fault."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.test_gpu_faults import NODE_UNHEALTHY, scenario
from tests.integration.test_train_through import (
    FLAGS,
    NEXT_STEP_S,
    SCRIPT,
    STEPS,
    _finals,
    _run,
    _steps,
    through_reference,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return through_reference(tmp_path_factory)


def test_a_node_lost_without_a_standby_leaves_its_shares_to_the_other(
    tmp_path: Path, reference: str
) -> None:
    """--nnodes=1:2: node 1 is killed whole; node 0's two workers go on alone, each
    holding two of the job's four logical ranks, and end as the four did."""
    cluster = LocalCluster(
        tmp_path,
        2,
        "1:2",
        FLAGS,
        conf="join_timeout=60,last_call_timeout=5",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        PROBE_STEP_SLEEP="0.02",
    )
    codes = cluster.kill_node_at(20, 1, 240)
    assert codes[0] == 0, cluster.log(0)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items() if rank < 2} == {
        0: reference,
        1: reference,
    }
    last = _steps(cluster, 0)[-1]
    assert last["world"] == 2 and last["logical"] == [0, 2]
    assert {s["pid"] for s in _steps(cluster, 0)} == {finals[0]["pid"]}


def test_thirty_faults_and_joins_leak_nothing(tmp_path: Path) -> None:
    """Rank 1 (its replacement each time) is killed at its fifth step of each of 30
    generations; the survivors' descriptors, threads, shared-memory mappings and process
    groups stay level, their resident memory grows by a bounded amount, and every rank
    ends with the same state."""
    cycles = 30
    faults = ";".join(f"rank=1,nth=5,action=kill,gen={g}" for g in range(cycles))
    cluster = _run(
        tmp_path,
        [f"--max-restarts={cycles + 1}", "--restart-backoff=0"],
        PROBE_FAULT=faults,
        PROBE_USAGE="1",
        PROBE_STEPS="100000",  # ended by the last fault's join: see PROBE_STOP_AFTER
        PROBE_STOP_AFTER=str(cycles),
    )
    finals = _finals(cluster)
    assert len(finals) == 4 and len({rec["digest"] for rec in finals.values()}) == 1
    for rank in (0, 2, 3):
        usage = [json.loads(line) for line in (cluster.out / f"usage_rank{rank}.jsonl").open()]
        assert max(u["generation"] for u in usage) == cycles, usage
        level = [u for u in usage if u["generation"] >= 2]
        first, last = level[0], level[-1]
        for key in ("fds", "threads", "shm_maps", "groups"):
            assert last[key] <= first[key] + 2, (key, first, last)
        assert last["rss_kib"] - first["rss_kib"] < 64 * 1024, (first, last)


@pytest.mark.parametrize("fault", ["node_kill", "sick_gpu"])
def test_a_node_lost_to_a_standby_whose_workers_join_when_warm(
    tmp_path: Path, reference: str, fault: str
) -> None:
    """Node 1 is killed whole, or its GPU falls off the bus (the fake NVML's XID 79: its
    agent takes it out, exit 77); a standby takes its place, its two new workers starting
    up (3 s each) while node 0's two kept ones train on holding all four data ranks."""
    flags = [*FLAGS, "--heartbeat-timeout=2", "--health-interval=0.5"]
    trigger = tmp_path / "trigger"
    sick = {"timeline": [{"after_file": str(trigger), "xid": 79}]}
    nvml = {i: scenario(tmp_path, f"node{i}", sick if i == 1 else None) for i in range(3)}
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        flags,
        conf="join_timeout=60",
        script=SCRIPT,
        node_env=nvml,
        PROBE_STEPS=STEPS,
        PROBE_STEP_SLEEP="0.05",
        PROBE_STARTUP_S="3",
    )
    try:
        deadline = time.monotonic() + 60
        cluster.start_standby(2, "2", flags, nvml[2])
        while "joined round 1" not in cluster.log(2):
            assert time.monotonic() < deadline, cluster.log(2)
            time.sleep(0.05)
        cluster.wait_progress(20)
        if fault == "node_kill":
            t_kill = cluster.kill_node(1)
        else:
            t_kill = time.time()
            trigger.touch()
        codes = cluster.wait_some([0, 1, 2], 180)
    finally:
        cluster.close()
    lost = -9 if fault == "node_kill" else NODE_UNHEALTHY  # SIGKILLed, or out: exit 77
    assert codes == [0, lost, 0], cluster.log(0) + cluster.log(1) + cluster.log(2)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == dict.fromkeys(
        range(4), reference
    )
    steps = _steps(cluster, 0)
    assert {s["pid"] for s in steps} == {finals[0]["pid"]}
    # steps begun before the fault was seen may end after it: those of generation 0
    after = [s for s in steps if s["t"] > t_kill and s["generation"] > 0]
    # the loss seen when its lease lapses (--heartbeat-timeout) or the GPU is read, then
    # on at once
    assert after[0]["world"] == 2 and after[0]["logical"] == [0, 2]
    assert after[0]["t"] - t_kill < 2 + NEXT_STEP_S
    assert after[-1]["world"] == 4
    (through,) = [e for e in cluster.events("train_through") if e.node == 0]
    assert through["kept"] == [0, 1] and through["joining"] == [2, 3]
