"""The `repair` event of a node that keeps no worker (issue 34), with real agents on two
localhost nodes of one worker each, real worker processes over gloo: every node that
took part in a repair in place writes one, so the job's record of the incident names
every rank it restarted; `rtrain report` and `rtrain status` read it as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rtrain.core.observe.repairs import RepairNote, merge
from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT

SCRIPT = str(ROOT / "tests" / "scripts" / "train_repairable.py")
FLAGS = ["--nproc-per-node=1", "--max-restarts=3", "--heartbeat-interval=0.5"]
REPORT = [sys.executable, "-m", "rtrain.cli.main", "report"]


def _run(tmp: Path, **env: str) -> LocalCluster:
    cluster = LocalCluster(
        tmp, 2, "2", FLAGS, conf="join_timeout=60", script=SCRIPT, PROBE_STEPS="30", **env
    )
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return cluster


def _json(cluster: LocalCluster, name: str) -> dict:
    return json.loads((cluster.out / name).read_text())


def _digests(cluster: LocalCluster) -> dict[int, str]:
    return {rank: _json(cluster, f"final_rank{rank}.json")["digest"] for rank in (0, 1)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's digest after a run without a fault."""
    return _digests(_run(tmp_path_factory.mktemp("reference")))


def _report(cluster: LocalCluster) -> dict:
    done = subprocess.run(
        [*REPORT, str(cluster.tmp / "logs"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_node_whose_only_worker_was_killed_writes_its_repair_event(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 1, node 1's only worker, is SIGKILLed: node 0 keeps rank 0, node 1 keeps none
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=kill")
    assert _digests(cluster) == reference
    first = _json(cluster, "enter_gen0_rank0.json")["pid"]
    assert _json(cluster, "final_rank0.json")["pid"] == first  # rank 0 was kept
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert sorted(repairs) == [0, 1], repairs  # before the fix: node 0's only
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == []
    assert repairs[1]["kept"] == [] and repairs[1]["restarted"] == [1]
    assert all(r["fallback"] == [] and not r["job_fallback"] for r in repairs.values())
    assert all(r["from_generation"] == 0 for r in repairs.values())
    # its replacement was forked when the fault was seen, before the next generation
    assert repairs[1]["fault_seen"] <= repairs[1]["spawn_started"] <= repairs[1]["parked"]
    assert not cluster.events("repair_fallback")  # a death is no failed repair
    # the report's incident names both ranks: kept 0, restarted 1
    report = _report(cluster)
    (row,) = [row for row in report["failures"] if row["generation"] == 0]
    assert row["repair"]["kept"] == [0] and row["repair"]["restarted"] == [1]
    # the status's last repair (the nodes' notes merged) says the same
    notes = [RepairNote.from_fields(fields) for fields in repairs.values()]
    (last,) = merge(notes).values()
    assert last.kept == (0,) and last.restarted == (1,)
    assert "kept ranks 0, restarted 1" in last.describe()


def test_a_node_whose_only_worker_does_not_park_writes_its_repair_event(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 0 (node 0) is killed; rank 1 (node 1) ignores the repair request: node 1
    # stops it (fallback) and keeps none; the failed repair is counted once, as before
    cluster = _run(tmp_path, PROBE_FAULT="rank=0,step=10,action=kill", PROBE_IGNORE="1")
    assert _digests(cluster) == reference
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert sorted(repairs) == [0, 1], repairs  # before the fix: none at all
    assert repairs[0]["kept"] == [] and repairs[0]["restarted"] == [0]
    assert repairs[1]["kept"] == [] and repairs[1]["fallback"] == [1]
    assert repairs[1]["restarted"] == [1] and not repairs[1]["job_fallback"]
    assert not cluster.events("repair_fallback")  # one failed repair of two
    # no process was kept anywhere: every worker restarted, not a repair in place
    report = _report(cluster)
    assert report["repairs"] == {}
    assert all(row["repair"] is None for row in report["failures"])
    notes = [RepairNote.from_fields(fields) for fields in repairs.values()]
    assert merge(notes) == {}
