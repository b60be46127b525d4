"""examples/pipeline_recycle.py under rtrain launch: torch PipelineStages scheduled by
ScheduleReCycle. A DP=2 x PP=2 job of one worker per node loses a node, then a second
one in the other replica and stage: the survivors run the lost workers' micro-batches,
restore by plan position and end with weights bitwise equal to a run that lost
nothing. A node that joins later takes the lost position over."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, RTRAIN, probe_env, run

pytestmark = pytest.mark.integration

EXAMPLE = str(ROOT / "examples" / "pipeline_recycle.py")
PROFILE = str(ROOT / "examples" / "recycle_profile.json")
FLAGS = ["--pp=2", f"--recycle-profile={PROFILE}"]
STEPS = "40"
NODE_FLAGS = ["--nproc-per-node=1", *FLAGS, "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def stage_digests(text: str) -> dict[int, str]:
    return {int(s): d for s, d in re.findall(r"stage (\d): params sha256 (\w+)", text)}


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The same job on one node, nothing lost: each stage's final weights."""
    tmp = tmp_path_factory.mktemp("reference")
    reference = run(
        [*RTRAIN, "--standalone", "--nproc-per-node=4", *FLAGS, EXAMPLE, "--steps", STEPS],
        probe_env(tmp),
        timeout=120,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    digests = stage_digests(reference.stdout)
    assert sorted(digests) == [0, 1]
    return digests


def pipeline_cluster(tmp: Path, flags: list[str]) -> LocalCluster:
    """Four nodes of one worker each (DP=2 x PP=2) running the example; each worker's
    records go to <tmp>/out."""
    out = tmp / "out"
    out.mkdir()
    args = ["--steps", STEPS, "--step-sleep", "0.15", "--record", str(out)]
    return LocalCluster(tmp, 4, "2:4", flags, script=EXAMPLE, script_args=args)


def finals(cluster: LocalCluster) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cluster.out.glob("final_rank*.json"))]


def where(cluster: LocalCluster, generation: int) -> dict[tuple[int, int], int]:
    """(replica, stage) -> the index of the node whose worker holds it in `generation`
    (one worker per node: the agent's node rank is its worker's rank)."""
    end = time.monotonic() + 60
    pattern = re.compile(rf"generation {generation}: .* this node rank (\d+)")
    while True:
        ranks = {}
        for index in range(len(cluster.procs)):
            found = pattern.search(cluster.log(index))
            if found:
                ranks[int(found.group(1))] = index
        records = {r: rec for (g, r), rec in cluster.records().items() if g == generation}
        if records and set(records) <= set(ranks) and len(records) == 4 - generation:
            return {tuple(rec["position"]): ranks[r] for r, rec in records.items()}
        assert time.monotonic() < end, cluster.log(0)
        time.sleep(0.05)


def diagonal_without_the_store(positions: dict[tuple[int, int], int]) -> list[tuple[int, int]]:
    """Two positions in different replicas and stages, neither on node 0: node 0 hosts
    the c10d rendezvous store, whose loss ends a job by design (etcd is the answer)."""
    for pair in ([(0, 1), (1, 0)], [(0, 0), (1, 1)]):
        if 0 not in (positions[p] for p in pair):
            return pair
    raise AssertionError(positions)


def test_two_lost_nodes_micro_batches_move_to_their_stage_peers_and_nothing_changes(
    tmp_path: Path, expected: dict[int, str]
) -> None:
    cluster = pipeline_cluster(tmp_path, NODE_FLAGS)
    try:
        cluster.wait_progress(6)
        lost = diagonal_without_the_store(where(cluster, 0))
        first = where(cluster, 0)[lost[0]]
        cluster.kill_node(first)
        # generation 1 re-routes the first position's work to its stage peer; then the
        # second goes too, and its stage peer takes its micro-batches: each stage is
        # down to one worker
        second = where(cluster, 1)[lost[1]]
        cluster.wait_progress(cluster.progress() + 3)
        cluster.kill_node(second)
        codes = cluster.wait()
    finally:
        cluster.close()
    survivors = [i for i in range(4) if i not in (first, second)]
    assert [codes[i] for i in survivors] == [0, 0], cluster.log(survivors[0])
    records = finals(cluster)
    assert len(records) == 2 and all(f["generation"] >= 2 for f in records)
    # two positions lost (which labels: a survivor may take over a lost rank's place
    # in rtrain's grid, and its position with it), one worker left per stage running
    # both replicas' micro-batches of that stage (4 + 4)
    assert len(records[0]["failed"]) == 2 and records[1]["failed"] == records[0]["failed"]
    assert sorted((f["stage"], f["forwards_per_step"]) for f in records) == [(0, 8), (1, 8)]
    # each generation resumed from in-memory snapshots, not from step 0
    restarts = [r for (gen, _), r in cluster.records().items() if gen >= 1]
    assert restarts and all(r["first_step"] >= 5 for r in restarts), restarts
    for final in records:  # bitwise the weights of the run that lost nothing
        assert final["digest"] == expected[final["stage"]], final


def test_a_node_that_joins_later_takes_the_lost_position_over(
    tmp_path: Path, expected: dict[int, str]
) -> None:
    """The newcomer holds no position of the last generation: it takes the failed one and
    restores it from a DP peer of that stage (nobody held it in generation 1)."""
    logs = tmp_path / "logs"
    flags = [*NODE_FLAGS, f"--log-dir={logs}"]
    cluster = pipeline_cluster(tmp_path, flags)
    try:
        cluster.wait_progress(6)
        position = diagonal_without_the_store(where(cluster, 0))[0]
        lost = where(cluster, 0)[position]
        cluster.kill_node(lost)
        where(cluster, 1)  # generation 1 is running, re-routed
        cluster.start_node(lost, "2:4", flags)  # a new node: admitted at generation 2
        codes = cluster.wait()
    finally:
        cluster.close()
    assert codes == [0, 0, 0, 0], cluster.log(lost)
    plans = [json.loads(p.read_text()) for p in sorted(logs.glob("*/attempt_2/recycle_plan.json"))]
    assert len(plans) == 4
    assert all(p["failed"] == [] and p["positions"] == plans[0]["positions"] for p in plans)
    newcomer = cluster.records()
    joined = [r for (gen, _), r in newcomer.items() if gen == 2 and r["position"] == [*position]]
    assert len(joined) == 1 and joined[0]["first_step"] >= 6, newcomer
    records = finals(cluster)
    assert sorted(f["generation"] for f in records) == [2, 2, 2, 2]
    assert all(f["forwards_per_step"] == 4 for f in records)  # the fault-free plan again
    for final in records:
        assert final["digest"] == expected[final["stage"]], final
