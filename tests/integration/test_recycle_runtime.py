"""examples/pipeline_recycle.py: a pipeline runtime that follows rtrain's ReCycle plan.
A DP=2 x PP=2 job loses a node; the survivors run its micro-batches and end with
weights bitwise equal to a run that lost nothing."""

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
STEPS = "24"
NODE_FLAGS = ["--nproc-per-node=1", *FLAGS, "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def stage_digests(text: str) -> dict[int, str]:
    return {int(s): d for s, d in re.findall(r"stage (\d): params sha256 (\w+)", text)}


def reference_digests(tmp: Path, steps: str) -> dict[int, str]:
    """The same job on one node, nothing lost: each stage's final weights."""
    reference = run(
        [*RTRAIN, "--standalone", "--nproc-per-node=4", *FLAGS, EXAMPLE, "--steps", steps],
        probe_env(tmp / "reference"),
        timeout=120,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = stage_digests(reference.stdout)
    assert sorted(expected) == [0, 1]
    return expected


def pipeline_cluster(tmp: Path, flags: list[str], steps: str, step_sleep: str) -> LocalCluster:
    """Four nodes of one worker each (DP=2 x PP=2) running the example; each worker's
    summary goes to <tmp>/out."""
    out = tmp / "out"
    out.mkdir()
    args = ["--steps", steps, "--step-sleep", step_sleep, "--record", str(out)]
    return LocalCluster(tmp, 4, "2:4", flags, script=EXAMPLE, script_args=args)


def finals(cluster: LocalCluster) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cluster.out.glob("final_rank*.json"))]


def test_a_lost_node_s_micro_batches_move_to_its_stage_peer_and_nothing_changes(
    tmp_path: Path,
) -> None:
    expected = reference_digests(tmp_path, STEPS)
    cluster = pipeline_cluster(tmp_path, NODE_FLAGS, STEPS, "0.1")
    codes = cluster.kill_node_at(6, 3)
    assert codes[:3] == [0, 0, 0], cluster.log(0)
    records = finals(cluster)
    assert len(records) == 3 and all(f["generation"] >= 1 for f in records)
    # the survivors went on from their snapshots, not from step 0: from the newest step
    # at which a copy of every previous rank's shard survives, one behind the newest
    # when the lost node died before its last snapshot was replicated
    assert all(f["first_step"] >= 5 for f in records), records
    # Node 3 held one (replica, stage); its same-stage peer now runs both replicas'
    # forwards of that stage (4 + 4 micro-batches), the others their own 4.
    lost = records[0]["failed"]
    assert len(lost) == 1 and all(f["failed"] == lost for f in records)
    forwards = {tuple(f["position"]): f["forwards_per_step"] for f in records}
    assert sorted(forwards.values()) == [4, 4, 8]
    helper = next(pos for pos, n in forwards.items() if n == 8)
    assert helper[1] == lost[0][1]
    # bitwise the weights of the run that lost nothing, at every worker of every stage
    for final in records:
        assert final["digest"] == expected[final["stage"]], final
    logs = "".join(cluster.log(i) for i in range(3))
    assert "1 failed worker(s) re-routed" in logs


def test_a_node_that_joins_later_follows_the_same_plan_as_the_others(tmp_path: Path) -> None:
    """A node that was not in the last generation takes the plan positions from the
    store: planning on the grid it rebuilds (rtrain's shrunk one) would give it another
    plan than its peers'."""
    steps = "60"
    expected = reference_digests(tmp_path, steps)
    logs = tmp_path / "logs"
    flags = [*NODE_FLAGS, f"--log-dir={logs}"]
    cluster = pipeline_cluster(tmp_path, flags, steps, "0.2")
    try:
        cluster.wait_progress(6)
        cluster.kill_node(3)
        end = time.monotonic() + 60
        while "ReCycle plan for generation 1" not in cluster.log(0):
            assert time.monotonic() < end, cluster.log(0)
            time.sleep(0.05)
        cluster.start_node(3, "2:4", flags)  # a new node: admitted at generation 2
        codes = cluster.wait()
    finally:
        cluster.close()
    assert codes == [0, 0, 0, 0], cluster.log(3)
    plans = [json.loads(p.read_text()) for p in sorted(logs.glob("*/attempt_2/recycle_plan.json"))]
    assert len(plans) == 4
    carried = [(p["dp"], p["pp"], p["failed"], p["positions"]) for p in plans]
    assert carried == [carried[0]] * 4
    assert carried[0][0] == 2 and len(carried[0][2]) == 1 and "3" not in carried[0][3]
    records = finals(cluster)
    assert sorted(f["generation"] for f in records) == [2, 2, 2]
    for final in records:
        assert final["digest"] == expected[final["stage"]], final
