"""Repair in place of a pipeline job (torch.distributed.pipelining scheduled by rtrain's
ScheduleReCycle, under rtrain.repairable), real agents on localhost nodes, real gloo:
on a fault the survivors keep their processes and their plan positions, rebuild their
stage and schedule on the next generation's group, run that generation's plan (the
ReCycle one while a position is lost, the full one once it is held again) and end
with the weights and optimizer state of a run without the fault, bitwise."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, RTRAIN, events_under, probe_env, run

pytestmark = pytest.mark.integration

SCRIPT = str(ROOT / "tests" / "scripts" / "train_repairable_pipeline.py")
PROFILE = str(ROOT / "examples" / "recycle_profile.json")
PIPELINE = ["--pp=2", f"--recycle-profile={PROFILE}", "--max-restarts=3"]
NODE_FLAGS = ["--nproc-per-node=1", *PIPELINE, "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]
NNODES = "2:4"  # four nodes of one worker each (DP=2 x PP=2); a fifth is a standby
STEPS = "30"
Position = tuple[int, int]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """stage -> its digest (parameters, optimizer state) after a run without a fault."""
    tmp = tmp_path_factory.mktemp("reference")
    cmd = [*RTRAIN, "--standalone", "--nproc-per-node=4", *PIPELINE, f"--log-dir={tmp}"]
    env = probe_env(tmp / "out", PROBE_STEPS=STEPS, PROBE_STEP_SLEEP="0")
    done = run([*cmd, SCRIPT], env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    finals = [json.loads(p.read_text()) for p in (tmp / "out").glob("final_rank*.json")]
    digests = {f["stage"]: f["digest"] for f in finals}
    assert len(finals) == 4 and sorted(digests) == [0, 1]
    assert len({f["digest"] for f in finals}) == 2  # both replicas of a stage agree
    return digests


def _cluster(tmp: Path, nodes: int, nnodes: str, flags: list[str], **env: str) -> LocalCluster:
    return LocalCluster(
        tmp,
        nodes,
        nnodes,
        flags,
        conf="join_timeout=60",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        **env,
    )


def _wait_for(what: str, check: Callable[[], bool], cluster: LocalCluster) -> None:
    end = time.monotonic() + 90
    while not check():
        assert time.monotonic() < end, f"never saw {what}:\n" + cluster.log(0)
        time.sleep(0.05)


def _entries(cluster: LocalCluster, generation: int) -> dict[Position, dict]:
    """plan position -> what its worker wrote on entering `generation`."""
    found = {}
    for path in cluster.out.glob(f"enter_gen{generation}_rank*.json"):
        record = json.loads(path.read_text())
        found[tuple(record["position"])] = record
    return found


def _finals(cluster: LocalCluster) -> dict[Position, dict]:
    found = {}
    for path in cluster.out.glob("final_rank*.json"):
        record = json.loads(path.read_text())
        found[tuple(record["position"])] = record
    return found


def _node_of(cluster: LocalCluster, generation: int, rank: int) -> int:
    """The index of the node whose (one) worker is `rank` in `generation`."""
    (start,) = [
        e
        for e in cluster.events("generation_start")
        if e.generation == generation and e.node == rank
    ]
    return int(start.agent.rsplit(".", 1)[1]) - 1


def _lost(cluster: LocalCluster) -> tuple[int, Position]:
    """A node to lose (the last in rank order; not node 0, which hosts the rendezvous
    store) and its worker's position in generation 0."""
    ranks = {}
    for path in cluster.out.glob("enter_gen0_rank*.json"):
        ranks[int(path.stem.rsplit("_rank", 1)[1])] = json.loads(path.read_text())["position"]
    for rank in sorted(ranks, reverse=True):
        index = _node_of(cluster, 0, rank)
        if index != 0:
            return index, tuple(ranks[rank])
    raise AssertionError(ranks)


def _held(cluster: LocalCluster, generation: int, ranks: int) -> bool:
    return len(list(cluster.out.glob(f"held_gen{generation}_rank*"))) == ranks


def _assert_same_state(finals: dict[Position, dict], reference: dict[int, str]) -> None:
    assert sorted(finals) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for position, record in finals.items():
        assert record["digest"] == reference[position[1]], (position, record)


def test_a_killed_worker_is_replaced_alone_and_the_pipeline_survivors_keep_their_processes(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # two nodes of two workers; rank 3 (node 1, position (1, 1)) SIGKILLs itself
    flags = ["--nproc-per-node=2", *PIPELINE, "--heartbeat-interval=0.5"]
    cluster = _cluster(tmp_path, 2, "2", flags, PROBE_FAULT="rank=3,step=6")
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    first, second = _entries(cluster, 0), _entries(cluster, 1)
    finals = _finals(cluster)
    _assert_same_state(finals, reference)
    for position in ((0, 0), (0, 1), (1, 0)):  # the survivors: one process throughout
        assert finals[position]["pid"] == first[position]["pid"] == second[position]["pid"]
        assert second[position]["repairs"] == 1
    assert second[(1, 1)]["pid"] != first[(1, 1)]["pid"]
    # the replacement holds the position again: the full plan, restored from step 5
    assert all(r["failed"] == [] and r["forwards_per_step"] == 4 for r in second.values())
    assert len({r["first_step"] for r in second.values()}) == 1
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0, 1] and repairs[0]["restarted"] == []
    assert repairs[1]["kept"] == [2] and repairs[1]["restarted"] == [3]


def test_a_lost_node_is_recycled_in_place_then_a_new_node_brings_the_full_schedule_back(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster = _cluster(tmp_path, 4, NNODES, NODE_FLAGS, PROBE_HOLD="gen=1,after=3")
    try:
        cluster.wait_progress(4)
        assert cluster.progress() < int(STEPS) - 5  # the fault comes mid-run
        lost, position = _lost(cluster)
        cluster.kill_node(lost)
        # generation 1 runs the ReCycle plan for three steps, then holds until the
        # newcomer's join ends it
        _wait_for("generation 1 under way", lambda: _held(cluster, 1, 3), cluster)
        cluster.start_node(lost, NNODES, NODE_FLAGS)
        codes = cluster.wait(180)
    finally:
        cluster.close()
    assert codes == [0, 0, 0, 0], cluster.log(0) + cluster.log(lost)
    first, recycled, full = (_entries(cluster, g) for g in range(3))
    survivors = [p for p in first if p != position]
    # generation 1: the lost position's micro-batches went to its stage peer
    assert sorted(recycled) == sorted(survivors)
    peer = (1 - position[0], position[1])
    for where, record in recycled.items():
        assert record["failed"] == [list(position)]
        assert record["forwards_per_step"] == (8 if where == peer else 4), (where, record)
        assert record["pid"] == first[where]["pid"] and record["repairs"] == 1
    # generation 2: the newcomer took the lost position, the full plan again, in place
    assert sorted(full) == sorted(first)
    assert all(r["failed"] == [] and r["forwards_per_step"] == 4 for r in full.values())
    for where in survivors:
        assert full[where]["pid"] == first[where]["pid"] and full[where]["repairs"] == 2
    finals = _finals(cluster)
    _assert_same_state(finals, reference)
    assert all(finals[where]["pid"] == first[where]["pid"] for where in survivors)
    # every node kept its worker at both repairs and restarted none
    repairs = cluster.events("repair")
    assert sorted(e["from_generation"] for e in repairs) == [0, 0, 0, 1, 1, 1]
    assert all(e["restarted"] == [] and e["fallback"] == [] for e in repairs)


def test_a_standby_takes_the_lost_position_and_the_survivors_keep_the_full_schedule(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster = _cluster(tmp_path, 4, NNODES, NODE_FLAGS, PROBE_HOLD="gen=0,after=4")
    try:
        _wait_for("generation 0 under way", lambda: _held(cluster, 0, 4), cluster)
        cluster.start_node(4, NNODES, NODE_FLAGS)  # beyond MAX: a standby
        _wait_for("the standby's join", lambda: "joined round 1" in cluster.log(4), cluster)
        lost, position = _lost(cluster)
        cluster.kill_node(lost)
        codes = cluster.wait_some([i for i in range(5) if i != lost], 180)
    finally:
        cluster.close()
    assert set(codes) == {0}, cluster.log(0) + cluster.log(4)
    first, second = _entries(cluster, 0), _entries(cluster, 1)
    survivors = [p for p in first if p != position]
    # the standby took the lost node's rank and position: the full plan at once
    assert sorted(second) == sorted(first)
    assert all(r["failed"] == [] and r["forwards_per_step"] == 4 for r in second.values())
    assert second[position]["pid"] != first[position]["pid"]
    assert second[position]["repairs"] == 0 and second[position]["first_step"] == 4
    for where in survivors:
        assert second[where]["pid"] == first[where]["pid"] and second[where]["repairs"] == 1
    finals = _finals(cluster)
    _assert_same_state(finals, reference)
    assert all(finals[where]["pid"] == first[where]["pid"] for where in survivors)


def _standalone(tmp: Path, nproc: int, extra: list[str], **env: str) -> dict[Position, dict]:
    """The job on one agent of `nproc` workers; every position's final record."""
    cmd = [*RTRAIN, "--standalone", f"--nproc-per-node={nproc}", *PIPELINE, *extra]
    environment = probe_env(tmp / "out", PROBE_STEPS="16", PROBE_STEP_SLEEP="0.05", **env)
    done = run([*cmd, f"--log-dir={tmp / 'logs'}", SCRIPT], environment, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {}
    for path in (tmp / "out").glob("final_rank*.json"):
        record = json.loads(path.read_text())
        found[tuple(record["position"])] = record
    return found


def test_a_worker_hung_in_its_stages_reduction_is_replaced_and_its_stage_peers_are_kept(
    tmp_path: Path,
) -> None:
    # DP=3: the stage's gradients are gathered over a group of three, in which one
    # survivor waits on the other while that one waits on the stopped worker; both
    # are freed and kept, the hung one is killed and replaced
    expected = _standalone(tmp_path / "reference", 6, [])
    fault = "rank=5,step=6,at=reduce,action=stop"
    faulted = tmp_path / "faulted"
    finals = _standalone(faulted, 6, ["--hang-timeout=3"], PROBE_FAULT=fault)
    assert {p: r["digest"] for p, r in finals.items()} == {
        p: r["digest"] for p, r in expected.items()
    }
    first = {}
    for path in (faulted / "out").glob("enter_gen0_rank*.json"):
        record = json.loads(path.read_text())
        first[tuple(record["position"])] = record["pid"]
    assert [p for p in first if first[p] != finals[p]["pid"]] == [(2, 1)]
    (repair,) = events_under(faulted / "logs", "repair")
    assert repair["kept"] == [0, 1, 2, 3, 4] and repair["restarted"] == [5]
    (hang,) = [e for e in events_under(faulted / "logs", "fault") if e["kind"] == "hang"]
    assert hang["rank"] == 5


def test_a_lost_stage_is_taken_over_in_place_by_a_survivor_of_the_other(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # both workers of one stage go at once: one survivor moves to that stage (its
    # process builds that stage's module and restores it from the lost ranks' replicas)
    cluster = _cluster(tmp_path, 4, NNODES, NODE_FLAGS)
    try:
        cluster.wait_progress(4)
        assert cluster.progress() < int(STEPS) - 5  # the fault comes mid-run
        where = {}
        for path in cluster.out.glob("enter_gen0_rank*.json"):
            rank = int(path.stem.rsplit("_rank", 1)[1])
            where[_node_of(cluster, 0, rank)] = tuple(json.loads(path.read_text())["position"])
        lost = sorted(i for i, p in where.items() if p[1] != where[0][1])
        for index in lost:
            cluster.kill_node(index)
        kept = sorted(set(where) - set(lost))
        codes = cluster.wait_some(kept, 180)
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(kept[1])
    first, second = _entries(cluster, 0), _entries(cluster, 1)
    pids = {r["pid"] for p, r in first.items() if p in (where[i] for i in kept)}
    assert {r["pid"] for r in second.values()} == pids  # the same two processes
    assert {p[1] for p in second} == {0, 1}  # both stages held again
    assert all(len(r["failed"]) == 2 and r["forwards_per_step"] == 8 for r in second.values())
    finals = _finals(cluster)
    assert len(finals) == 2 and {r["pid"] for r in finals.values()} == pids
    for position, record in finals.items():
        assert record["digest"] == reference[position[1]], (position, record)
