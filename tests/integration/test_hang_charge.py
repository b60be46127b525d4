"""A hang across nodes is charged to the rank that stopped, not to the healthy ranks
left waiting for it in a collective (they are its victims): in the fault events, the
ledger (so `rtrain status`), `rtrain report` and the exit summary."""

from __future__ import annotations

import json
import subprocess
import sys

from rtrain.core.observe.report import build_report
from tests.integration.cluster import LocalCluster, final_records

FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=2"]
HANG_TIMEOUT = 2.0
REPORT = [sys.executable, "-m", "rtrain.cli.main", "report"]


def _hang_job(
    tmp_path, nodes: int, fault: str, timeouts: list[float] | None = None, **node_faults: str
) -> LocalCluster:
    """A job of `nodes` nodes of one worker each; timeouts: each node's --hang-timeout
    (PET_HANG_TIMEOUT), HANG_TIMEOUT on every node if not given; node_faults: a
    PROBE_FAULT of node N's own, as nodeN=...."""
    timeouts = timeouts or [HANG_TIMEOUT] * nodes
    node_env = {n: {"PET_HANG_TIMEOUT": f"{t:g}"} for n, t in enumerate(timeouts)}
    for name, value in node_faults.items():
        node_env[int(name.removeprefix("node"))]["PROBE_FAULT"] = value
    return LocalCluster(
        tmp_path,
        nodes,
        str(nodes),
        ["--nproc-per-node=1", "--max-restarts=2", *FAST],
        node_env=node_env,
        PROBE_STEPS="40",
        PROBE_FAULT=fault,
    )


def _run(cluster: LocalCluster) -> list[int | None]:
    try:
        return cluster.wait(90)
    finally:
        cluster.close()


def _assert_charged(cluster: LocalCluster, culprits: list[int], tmp_path) -> None:
    """Every culprit rank (rank n on node n) was recorded hung, not as a victim, by its
    own node; every other rank's fault is a victim; the report, the exit summary and the
    ledger's charge name a culprit; the job ran again within --hang-timeout + 2 s."""
    faults = [e for e in cluster.events("fault") if e.generation == 0]
    for rank in culprits:
        (stopped,) = [e for e in faults if e["rank"] == rank]
        where = (stopped["kind"], stopped["fault_node"], stopped["host"])
        assert where == ("hang", rank, f"127.0.0.{rank + 1}"), faults
        assert stopped["victim"] is False and "process stopped" in stopped["message"]
    assert all(e["victim"] is True for e in faults if e["rank"] not in culprits), faults
    hosts = [f"127.0.0.{rank + 1}" for rank in culprits]
    # rtrain report: the incident is a culprit's, the others counted with it
    (row,) = build_report(cluster.events()).failures
    assert row.kind == "hang" and row.where in [
        f"rank {r} on node {r} ({h})" for r, h in zip(culprits, hosts, strict=True)
    ]
    assert row.also == len(faults) - 1
    report = subprocess.run(
        [*REPORT, str(tmp_path / "logs"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["failures"][0]["where"] == row.where
    # the exit summary (node 0 prints what the job recovered from): a culprit is the root
    # cause, node 0's blocked rank its victim
    log = cluster.log(0)
    summary = log[log.index("succeeded after") :]
    root = next(line for line in summary.splitlines() if "│ root cause" in line)
    assert "hang" in root and any(host in root for host in hosts), summary
    victims = [
        row
        for row in summary.splitlines()
        if [c.strip() for c in row.split("│")[1:2]] == ["victim"]
    ]
    assert len(victims) == sum(e["victim"] for e in faults), summary
    # a culprit's node was charged the failure when the next round closed
    logs = "".join(cluster.log(n) for n in range(len(cluster.procs)))
    assert any(f"charged to {host}" in logs for host in hosts), logs
    # a stopped worker was killed at once, not after a SIGTERM grace it cannot act on
    assert "ignored SIGTERM" not in logs, logs
    # fault -> next step within --hang-timeout + 2 s, less what the restart's spawns
    # waited for the pool's warm-up imports (a fork must not come during one; the fault
    # at step 24 meets the warm-up, 10 s after the pool's start, where steps are fast)
    first_step = min(rec["t_first_step"] for rec in final_records(cluster).values())
    fault = min(cluster.fault_time(rank) for rank in culprits)
    warm_up_wait = max(
        e["warm_up_wait_s"] for e in cluster.events("generation_start") if e.generation == 1
    )
    assert first_step - fault - warm_up_wait < HANG_TIMEOUT + 2.0, (
        first_step - fault,
        warm_up_wait,
    )


def test_a_stopped_worker_on_node_1_is_charged_not_node_0s_healthy_rank(tmp_path):
    cluster = _hang_job(tmp_path, 2, "rank=1,step=24,gen=0,action=stop")
    codes = _run(cluster)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    assert sorted(final_records(cluster)) == [0, 1]
    _assert_charged(cluster, [1], tmp_path)


def test_a_stopped_worker_is_recorded_when_the_job_moves_on_before_its_own_check(tmp_path):
    """Node 1's hang check would fire late (--hang-timeout=30 there): node 0 finds its
    healthy rank hung waiting in the collective first, and node 1 is told to rejoin."""
    cluster = _hang_job(tmp_path, 2, "rank=1,step=24,gen=0,action=stop", [HANG_TIMEOUT, 30])
    codes = _run(cluster)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    _assert_charged(cluster, [1], tmp_path)
    (stopped,) = [e for e in cluster.events("fault") if e["rank"] == 1]
    assert "found as the generation ended" in stopped["message"]


def test_two_stopped_workers_on_two_nodes_are_both_recorded(tmp_path):
    cluster = _hang_job(
        tmp_path,
        3,
        "",
        [HANG_TIMEOUT, 30, 30],
        node1="rank=1,step=24,gen=0,action=stop",
        node2="rank=2,step=24,gen=0,action=stop",
    )
    codes = _run(cluster)
    assert codes == [0, 0, 0], "".join(cluster.log(n) for n in range(3))
    _assert_charged(cluster, [1, 2], tmp_path)
