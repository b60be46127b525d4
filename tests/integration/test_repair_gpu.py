"""Repair in place after a sick GPU (issue 34's faults): three active nodes of
rtrain.repairable workers and a standby, each agent reading its own fake NVML scenario
(RTRAIN_FAKE_NVML). Node 1's GPU reports XID 79 (fallen off the bus) at a step the test
picks: its agent takes the node out of the job (exit 77), the standby takes its rank and
restores it from the peers' replicas, and the survivors keep their processes and ranks;
the job ends bitwise equal to the run without a fault. Everything above pynvml (reader,
monitor, verdict, the node's leaving, the others' repair) is the real code."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.test_gpu_faults import NODE_UNHEALTHY, scenario
from tests.integration.test_standby_takeover import (
    ENV,
    FLAGS,
    LOST,
    NNODES,
    SCRIPT,
    _json,
    _pid,
    _wait_for,
    three_nodes_reference,
)

HEALTH = ["--health-interval=0.5"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's digest after the three nodes' run without a fault (made once a run,
    shared with test_standby_takeover.py and test_repair_node_faults.py)."""
    return three_nodes_reference(tmp_path_factory)


def test_a_sick_gpu_takes_its_node_out_and_the_survivors_keep_their_processes(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    trigger = tmp_path / "trigger"
    sick = {"timeline": [{"after_file": str(trigger), "xid": 79}]}
    node_env = {i: scenario(tmp_path, f"node{i}", sick if i == LOST else None) for i in range(3)}
    flags = [*FLAGS, *HEALTH]
    cluster = LocalCluster(
        tmp_path, 3, NNODES, flags, conf="join_timeout=60", script=SCRIPT, node_env=node_env, **ENV
    )
    try:
        _wait_for("round 0's close", lambda: bool(cluster.events("generation_start")), cluster)
        cluster.start_node(3, NNODES, flags, scenario(tmp_path, "node3"))
        _wait_for("the standby's join", lambda: "joined round 1" in cluster.log(3), cluster)
        cluster.wait_progress(2)
        assert cluster.progress() < int(ENV["PROBE_STEPS"]) - 5  # the fault comes mid-run
        trigger.touch()
        codes = cluster.wait_some([0, 1, 2, 3], 180)
    finally:
        cluster.close()
    assert codes == [0, NODE_UNHEALTHY, 0, 0], cluster.log(0) + cluster.log(LOST)
    # the sick node's agent found the GPU and took its node out
    (fault,) = [e for e in cluster.events("fault") if e["kind"] == "unhealthy_gpu"]
    assert (fault["host"], fault["rank"]) == (f"127.0.0.{LOST + 1}", None)
    # the standby took the lost rank; the survivors kept their processes and ranks
    finals = {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(3)}
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    for rank in (0, 2):
        assert finals[rank]["pid"] == _pid(cluster, 0, rank)
        assert _json(cluster, f"enter_gen1_rank{rank}.json")["repairs"] == 1
    starts = {e.agent: e.node for e in cluster.events("generation_start") if e.generation == 1}
    assert starts == {"127.0.0.1": 0, "127.0.0.4": LOST, "127.0.0.3": 2}
    repairs = {e.agent: e.fields for e in cluster.events("repair")}
    assert repairs["127.0.0.1"]["kept"] == [0] and repairs["127.0.0.3"]["kept"] == [2]
    assert all(r["fallback"] == [] for r in repairs.values())
