"""Repair in place with a standby node (rtrain.repairable), real agents on localhost
nodes, real gloo: three active nodes (--nnodes 2:3) and a fourth that joins while they
run, a standby beyond the active count. The standby's pool warms up and forks its
worker's process ahead; a lost node's rank goes to the standby, whose worker (that
process) restores it from the peers' replicas; the survivors keep their processes and
their ranks, and the job ends bitwise equal to a run without the fault. Without a
standby the world shrinks, the survivors still keeping their processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT
from tests.integration.shared_runs import once_per_run

SCRIPT = str(ROOT / "tests" / "scripts" / "train_repairable.py")
STEPS = "200"  # long enough for the standby to warm up before the fault
NNODES = "2:3"  # three active nodes; a fourth waits as a standby
FLAGS = [
    "--nproc-per-node=1",
    "--max-restarts=3",
    "--heartbeat-interval=0.5",
    "--heartbeat-timeout=2",
]
ENV = {"PROBE_STEPS": STEPS, "PROBE_STEP_SLEEP": "0.05"}
LOST = 1  # the node (and, one worker a node, the rank) killed


def _cluster(tmp: Path) -> LocalCluster:
    return LocalCluster(tmp, 3, NNODES, FLAGS, conf="join_timeout=60", script=SCRIPT, **ENV)


def _json(cluster: LocalCluster, name: str) -> dict:
    return json.loads((cluster.out / name).read_text())


def _pid(cluster: LocalCluster, generation: int, rank: int) -> int:
    return int(_json(cluster, f"enter_gen{generation}_rank{rank}.json")["pid"])


def _wait_for(what: str, check: Callable[[], bool], cluster: LocalCluster) -> None:
    end = time.monotonic() + 60
    while not check():
        assert time.monotonic() < end, f"never saw {what}:\n" + cluster.log(0)
        time.sleep(0.05)


def _forked_ahead(cluster: LocalCluster, index: int) -> list[int]:
    """The processes node `index`'s pool forked and holds (spares: no worker runs)."""
    try:
        pools = psutil.Process(cluster.procs[index].pid).children()
        return [child.pid for pool in pools for child in pool.children()]
    except psutil.Error:
        return []


def _run(tmp: Path, standby: bool) -> tuple[LocalCluster, list[int]]:
    """The three nodes train; with `standby`, a fourth joins once they started (round
    0 closed: it waits in round 1) and its pool forks its worker's process ahead; then
    node LOST is SIGKILLed whole (agent, pool, worker). The cluster, and the processes
    the standby's pool had forked ahead."""
    cluster = _cluster(tmp)
    ahead: list[int] = []

    def forked() -> bool:
        ahead[:] = _forked_ahead(cluster, 3)
        return bool(ahead)

    try:
        if standby:  # once round 0 closed: the fourth node waits in round 1
            _wait_for("round 0's close", lambda: bool(cluster.events("generation_start")), cluster)
            cluster.start_node(3, NNODES, FLAGS)
            _wait_for("the standby's join", lambda: "joined round 1" in cluster.log(3), cluster)
            _wait_for("its worker forked ahead", forked, cluster)
        cluster.wait_progress(2)
        assert cluster.progress() < int(STEPS) - 5  # the fault comes mid-run
        cluster.kill_node(LOST)
        codes = cluster.wait_some([0, 2, 3] if standby else [0, 2], 180)
    finally:
        cluster.close()
    assert set(codes) == {0}, cluster.log(0) + cluster.log(2)
    return cluster, ahead


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's digest after a run of the three active nodes without a fault, once
    per test run (test_repair_node_faults.py uses the same run)."""
    return three_nodes_reference(tmp_path_factory)


def three_nodes_reference(factory: pytest.TempPathFactory) -> dict[int, str]:
    def produce(tmp: Path) -> dict[int, str]:
        cluster = _cluster(tmp)
        codes = cluster.finish(180)
        assert codes == [0, 0, 0], cluster.log(0)
        return {rank: _json(cluster, f"final_rank{rank}.json")["digest"] for rank in range(3)}

    shared = once_per_run(factory, "three_nodes_reference", produce)
    return {int(rank): digest for rank, digest in shared.items()}


def test_a_standby_takes_over_the_lost_nodes_rank_and_the_survivors_keep_theirs(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster, ahead = _run(tmp_path, standby=True)
    finals = {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(3)}
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    assert all(rec["world"] == 3 for rec in finals.values())
    for rank in (0, 2):  # the survivors: the same process, the same rank, repaired once
        assert finals[rank]["pid"] == _pid(cluster, 0, rank)
        assert _json(cluster, f"enter_gen1_rank{rank}.json")["repairs"] == 1
    # the standby (127.0.0.4) took the lost node's place: node rank 1, global rank 1
    starts = {e.agent: e for e in cluster.events("generation_start") if e.generation == 1}
    assert starts["127.0.0.4"].node == LOST
    assert starts["127.0.0.1"].node == 0 and starts["127.0.0.3"].node == 2
    assert starts["127.0.0.4"]["members"] == ["127.0.0.1", "127.0.0.4", "127.0.0.3"]
    assert finals[LOST]["pid"] == _pid(cluster, 1, LOST) != _pid(cluster, 0, LOST)
    # its worker is the process its pool forked ahead, after a warm-up not starved by
    # the busy machine (before: forked at the takeover, or a fresh interpreter)
    assert ahead == [_pid(cluster, 1, LOST)]
    assert "fresh interpreter" not in cluster.log(3)
    assert _json(cluster, f"enter_gen1_rank{LOST}.json")["repairs"] == 0
    # its worker restored the lost rank's state from the survivors' replicas (memory)
    (restore,) = [e for e in cluster.events("restore") if e.agent == "127.0.0.4"]
    assert restore["source"] == "memory" and restore["fetched"] == 1 and restore["local"] == 0
    repairs = {e.agent: e.fields for e in cluster.events("repair")}
    assert repairs["127.0.0.1"]["kept"] == [0] and repairs["127.0.0.3"]["kept"] == [2]
    assert all(r["restarted"] == [] and r["fallback"] == [] for r in repairs.values())


def test_without_a_standby_the_world_shrinks_and_the_survivors_keep_their_processes(
    tmp_path: Path,
) -> None:
    cluster, _ = _run(tmp_path, standby=False)
    finals = {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(2)}
    assert all(rec["world"] == 2 for rec in finals.values())
    assert not (cluster.out / "final_rank2.json").exists()
    # node 2 closed up to node rank 1: its kept worker went on as rank 1
    assert finals[0]["pid"] == _pid(cluster, 0, 0)
    assert finals[1]["pid"] == _pid(cluster, 0, 2) == _pid(cluster, 1, 1)
    starts = {e.agent: e.node for e in cluster.events("generation_start") if e.generation == 1}
    assert starts == {"127.0.0.1": 0, "127.0.0.3": 1}
