"""Repair in place of an FSDP2 job (rtrain.repairable, fully_shard over gloo), with real
agents on localhost nodes and real worker processes: a fault stops only what failed,
the survivors keep their processes, shard the model again on the next generation's
mesh and load the newest save through torch.distributed.checkpoint over rtrain's
memory (resharded when the world shrank), and the job's state equals a run without
the fault (tests/scripts/train_repairable_fsdp.py). With HSDP (a 2-D mesh) a survivor
blocked in a sub-group on a node that hangs whole is released and kept too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT

SCRIPT = str(ROOT / "tests" / "scripts" / "train_repairable_fsdp.py")
STEPS = "24"
FLAGS = ["--nproc-per-node=2", "--max-restarts=3", "--heartbeat-interval=0.5"]


def _cluster(tmp: Path, nnodes: str, flags: list[str], **env: str) -> LocalCluster:
    return LocalCluster(
        tmp, 2, nnodes, [*FLAGS, *flags], conf="join_timeout=60", script=SCRIPT, **env
    )


def _json(cluster: LocalCluster, name: str) -> dict:
    return json.loads((cluster.out / name).read_text())


def _finals(cluster: LocalCluster, ranks: int) -> dict[int, dict]:
    return {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(ranks)}


def _pid(cluster: LocalCluster, generation: int, rank: int) -> int:
    return int(_json(cluster, f"enter_gen{generation}_rank{rank}.json")["pid"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    """The job on 2 nodes x 2 workers without a fault: each rank's final shards, and
    the whole state's digest after every step (full_step<S>.txt)."""
    cluster = _cluster(
        tmp_path_factory.mktemp("reference"), "2", [], PROBE_STEPS=STEPS, PROBE_FULL_DIGESTS="1"
    )
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return cluster


def test_killed_workers_are_replaced_alone_and_the_survivors_reshard_in_their_processes(
    tmp_path: Path, reference: LocalCluster
) -> None:
    # Two repairs in one job: rank 1 (node 0) is SIGKILLed at the top of step 6 (the
    # others in FSDP2's all-gather of the forward), then, in generation 1, rank 2
    # (node 1) just before its dcp.save of step 14 (the others in DCP's collectives).
    faults = "rank=1,step=6,action=kill;rank=2,step=1014,action=kill,gen=1"
    cluster = _cluster(tmp_path, "2", [], PROBE_STEPS=STEPS, PROBE_FAULT=faults)
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    finals = _finals(cluster, 4)
    assert {r: f["digest"] for r, f in finals.items()} == {
        r: f["digest"] for r, f in _finals(reference, 4).items()
    }
    assert all(f["world"] == 4 for f in finals.values())
    # ranks 0 and 3: one process through both repairs; rank 1's replacement kept by
    # the second; rank 2 kept by the first, replaced by the second
    assert finals[0]["pid"] == _pid(cluster, 0, 0) == _pid(cluster, 1, 0)
    assert finals[3]["pid"] == _pid(cluster, 0, 3) == _pid(cluster, 1, 3)
    assert finals[1]["pid"] == _pid(cluster, 1, 1) != _pid(cluster, 0, 1)
    assert _pid(cluster, 1, 2) == _pid(cluster, 0, 2) != finals[2]["pid"]
    assert _json(cluster, "enter_gen2_rank0.json")["repairs"] == 2
    repairs = {(e.node, e["from_generation"]): e.fields for e in cluster.events("repair")}
    assert repairs[(0, 0)]["kept"] == [0] and repairs[(0, 0)]["restarted"] == [1]
    assert repairs[(1, 0)]["kept"] == [2, 3] and repairs[(1, 0)]["restarted"] == []
    assert repairs[(0, 1)]["kept"] == [0, 1] and repairs[(0, 1)]["restarted"] == []
    assert repairs[(1, 1)]["kept"] == [3] and repairs[(1, 1)]["restarted"] == [2]
    assert all(r["fallback"] == [] for r in repairs.values())
    for generation in (1, 2):
        # each load read the step every rank had saved, equal to the reference's
        steps = {_json(cluster, f"restored_gen{generation}_rank{r}.json")["step"] for r in range(4)}
        (step,) = steps
        digest = (reference.out / f"full_step{step}.txt").read_text()
        assert _json(cluster, f"restored_gen{generation}_rank0.json")["digest"] == digest
        # what the old generation held is gone: its process group, and its mesh from
        # DTensor's caches (before: Adam's moments came out of the first repaired step
        # on the old mesh, and the old group lived on in its registry)
        for rank in range(4):
            entered = _json(cluster, f"enter_gen{generation}_rank{rank}.json")
            assert entered["old_group"] is False
            first = _json(cluster, f"first_step_gen{generation}_rank{rank}.json")
            assert first["on_this_mesh"] is True


def test_a_lost_node_shrinks_the_world_and_the_survivors_reshard_in_place(
    tmp_path: Path, reference: LocalCluster
) -> None:
    # node 1 (ranks 2 and 3) is SIGKILLed whole with no standby: node 0's two workers
    # keep their processes and ranks, shard the model over a mesh of 2 and load the 4
    # ranks' save resharded (33 rows over 2 ranks, not 4)
    cluster = _cluster(
        tmp_path,
        "1:2",
        ["--heartbeat-timeout=2"],
        PROBE_STEPS=STEPS,
        PROBE_STEP_SLEEP="0.1",
    )
    try:
        cluster.wait_progress(6)
        cluster.kill_node(1)
        (code,) = cluster.wait_some([0], 180)
    finally:
        cluster.close()
    assert code == 0, cluster.log(0)
    for rank in (0, 1):
        assert _json(cluster, f"enter_gen0_rank{rank}.json")["world"] == 4
        assert _json(cluster, f"final_rank{rank}.json")["world"] == 2
        assert _json(cluster, f"final_rank{rank}.json")["pid"] == _pid(cluster, 0, rank)
        entered = _json(cluster, f"enter_gen1_rank{rank}.json")
        assert entered["repairs"] == 1 and entered["old_group"] is False
        assert _json(cluster, f"first_step_gen1_rank{rank}.json")["on_this_mesh"] is True
    (step,) = {_json(cluster, f"restored_gen1_rank{r}.json")["step"] for r in (0, 1)}
    restored = _json(cluster, "restored_gen1_rank0.json")
    assert restored["world"] == 2
    assert restored["digest"] == (reference.out / f"full_step{step}.txt").read_text()
    (repair,) = [e.fields for e in cluster.events("repair")]
    assert repair["kept"] == [0, 1] and repair["restarted"] == [] and repair["fallback"] == []


@pytest.fixture(scope="module")
def hsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's final shards of the HSDP job (a 2 x 2 mesh) without a fault."""
    tmp = tmp_path_factory.mktemp("hsdp_reference")
    cluster = _cluster(tmp, "2", [], PROBE_STEPS=STEPS, PROBE_MESH="hsdp")
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return {r: f["digest"] for r, f in _finals(cluster, 4).items()}


def test_a_hung_worker_of_an_hsdp_mesh_is_replaced_alone_and_the_job_still_matches(
    tmp_path: Path, hsdp_reference: dict[int, str]
) -> None:
    # HSDP: a 2-D mesh (replicated over 2, sharded within each half), so the survivors
    # also wait in the sub-groups init_device_mesh made. Rank 1 is SIGSTOPped and the
    # hang watch kills it alone: every survivor is kept, and the job ends with the
    # shards of the run without a fault.
    cluster = _cluster(
        tmp_path,
        "2",
        ["--hang-timeout=5"],
        PROBE_STEPS=STEPS,
        PROBE_MESH="hsdp",
        PROBE_FAULT="rank=1,step=10,action=stop",
    )
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    finals = _finals(cluster, 4)
    assert {r: f["digest"] for r, f in finals.items()} == hsdp_reference
    for rank in (0, 2, 3):
        assert finals[rank]["pid"] == _pid(cluster, 0, rank) == _pid(cluster, 1, rank)
        assert _json(cluster, f"first_step_gen1_rank{rank}.json")["on_this_mesh"] is True
    assert finals[1]["pid"] == _pid(cluster, 1, 1) != _pid(cluster, 0, 1)
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == [1]
    assert repairs[1]["kept"] == [2, 3] and repairs[1]["restarted"] == []
    assert all(r["fallback"] == [] for r in repairs.values())
    (hang,) = [e.fields for e in cluster.events("fault") if e.fields["kind"] == "hang"]
    assert hang["rank"] == 1


def _wait_for(what: str, check: Callable[[], bool], cluster: LocalCluster) -> None:
    end = time.monotonic() + 60
    while not check():
        assert time.monotonic() < end, f"never saw {what}:\n" + cluster.log(0)
        time.sleep(0.02)


def _stopped(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    return False


def test_survivors_blocked_in_an_hsdp_sub_group_on_a_stopped_node_are_kept(
    tmp_path: Path, hsdp_reference: dict[int, str]
) -> None:
    # HSDP over 2 nodes x 2 workers: mesh [[0, 1], [2, 3]], so node 0's workers shard
    # with each other and replicate with node 1's. Node 1 hangs whole: its workers stop
    # themselves at the top of step 10, the test then SIGSTOPs its agent and pool, so
    # no one kills the hung workers. Node 0's survivors wait in the replicate
    # sub-groups' all-reduce of step 10's backward, a group init_device_mesh made:
    # the release must shut down its connections too (before: only the world group's,
    # so they stayed blocked until the groups' 60 s timeout, and their agent restarted
    # them after 5 s, the fallback). Once they are parked, node 1 is replaced.
    faults = "rank=2,step=10,action=stop;rank=3,step=10,action=stop"
    cluster = _cluster(
        tmp_path,
        "2",
        ["--heartbeat-timeout=2"],
        PROBE_STEPS=STEPS,
        PROBE_MESH="hsdp",
        PROBE_FAULT=faults,
    )
    try:
        for rank in (2, 3):
            entered = (cluster.out / f"enter_gen0_rank{rank}.json").exists
            _wait_for(f"rank {rank}'s entry", entered, cluster)
            _wait_for(f"rank {rank}'s stop", lambda r=rank: _stopped(_pid(cluster, 0, r)), cluster)
        for pid in cluster.node_pids(1):  # the whole node hangs: agent and pool too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        _wait_for("node 0's repair", lambda: bool(cluster.events("repair")), cluster)
        cluster.replace_node(1, "2", [*FLAGS, "--heartbeat-timeout=2"], pause=0)
        codes = cluster.wait(180)
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    (repair,) = [e.fields for e in cluster.events("repair")]
    assert repair["kept"] == [0, 1] and repair["restarted"] == [] and repair["fallback"] == []
    finals = _finals(cluster, 4)
    assert {r: f["digest"] for r, f in finals.items()} == hsdp_reference
    assert all(f["world"] == 4 for f in finals.values())
    for rank in (0, 1):  # repaired in place: the same process through both generations
        assert finals[rank]["pid"] == _pid(cluster, 0, rank) == _pid(cluster, 1, rank)
        assert _json(cluster, f"first_step_gen1_rank{rank}.json")["on_this_mesh"] is True
    for rank in (2, 3):  # the hung node's workers, replaced with it
        assert finals[rank]["pid"] != _pid(cluster, 0, rank)
