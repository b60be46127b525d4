"""Repair in place (rtrain.repairable), with real agents on two localhost nodes, real
worker processes over gloo: a fault stops only what failed, the survivors keep their
processes, and the job ends bitwise equal to a run without the fault."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from rtrain.agent.repair.coordinator import ACK_S
from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT

SCRIPT = str(ROOT / "tests" / "scripts" / "train_repairable.py")
STEPS = "40"
FLAGS = ["--nproc-per-node=2", "--max-restarts=3", "--heartbeat-interval=0.5"]


def _run(tmp: Path, flags: list[str] | None = None, **env: str) -> LocalCluster:
    cluster = LocalCluster(
        tmp,
        2,
        "2",
        [*FLAGS, *(flags or [])],
        conf="join_timeout=60",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        **env,
    )
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return cluster


def _json(cluster: LocalCluster, name: str) -> dict:
    return json.loads((cluster.out / name).read_text())


def _finals(cluster: LocalCluster) -> dict[int, dict]:
    return {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(4)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's digest after a run without a fault."""
    cluster = _run(tmp_path_factory.mktemp("reference"))
    return {rank: rec["digest"] for rank, rec in _finals(cluster).items()}


def _entered(cluster: LocalCluster, generation: int, rank: int) -> dict:
    return _json(cluster, f"enter_gen{generation}_rank{rank}.json")


def test_a_killed_worker_is_restarted_alone_and_the_survivors_keep_their_processes(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=kill")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    for rank in (0, 2, 3):  # the survivors: the same process from the start to the end
        assert finals[rank]["pid"] == _entered(cluster, 0, rank)["pid"]
        assert _entered(cluster, 1, rank)["repairs"] == 1
    assert finals[1]["pid"] != _entered(cluster, 0, 1)["pid"]
    assert _entered(cluster, 1, 1)["repairs"] == 0
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == [1]
    assert repairs[1]["kept"] == [2, 3] and repairs[1]["restarted"] == []
    assert all(r["fallback"] == [] and r["from_generation"] == 0 for r in repairs.values())
    # rank 1's replacement was forked when the fault was seen, beside the parking, not
    # after it: before node 0 restored the next generation's snapshots, which comes
    # before the spawn (measured: forked 1 ms after the fault was seen and 0.25 s before
    # the restore; with the fork at the spawn, 3 ms after the restore)
    assert repairs[0]["fault_seen"] <= repairs[0]["spawn_started"] <= repairs[0]["parked"]
    assert repairs[1]["spawn_started"] is None  # nothing of node 1's to replace
    (restore,) = [e for e in cluster.events("restore") if e.node == 0 and e.generation == 1]
    created = _entered(cluster, 1, 1)["created"]  # to a clock tick (10 ms)
    assert created + 0.02 < restore.t


def test_a_survivor_that_ignores_the_repair_is_restarted_and_the_job_still_matches(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=kill", PROBE_IGNORE="2")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    for rank in (0, 3):
        assert finals[rank]["pid"] == _entered(cluster, 0, rank)["pid"]
    assert finals[2]["pid"] != _entered(cluster, 0, 2)["pid"]
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[1]["kept"] == [3] and repairs[1]["fallback"] == [2]
    assert repairs[1]["restarted"] == [2]
    # it waits, idle, in the function after its release: it says it is stuck, and its
    # agent stops it then, not after ACK_S (5 s) of waiting for an answer
    assert repairs[1]["stuck"] == [2] and repairs[1]["seconds"] < ACK_S - 1, repairs[1]


def test_a_hung_worker_is_replaced_alone_and_the_survivors_blocked_on_it_go_on(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    cluster = _run(tmp_path, ["--hang-timeout=5"], PROBE_FAULT="rank=1,step=10,action=stop")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    for rank in (0, 2, 3):  # victims waiting on the stopped rank: not killed, repaired
        assert finals[rank]["pid"] == _entered(cluster, 0, rank)["pid"]
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == [1]
    assert repairs[1]["kept"] == [2, 3] and repairs[1]["restarted"] == []
    (hang,) = [e.fields for e in cluster.events("fault") if e.fields["kind"] == "hang"]
    assert hang["rank"] == 1


def test_a_repair_that_fails_twice_falls_back_for_the_whole_job(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # Rank 1 is killed in generations 0, 1 and 2; rank 2 (node 1) ignores every repair
    # request, so node 1's repairs of generations 0 and 1 fail. Node 0's never do: with
    # the fallback counted per node it went on repairing in generation 2.
    faults = ";".join(f"rank=1,step={s},action=kill,gen={g}" for g, s in enumerate((8, 16, 24)))
    cluster = _run(tmp_path, PROBE_FAULT=faults, PROBE_IGNORE="2")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    repairs = [(e.node, e.fields) for e in cluster.events("repair")]
    assert sorted((node, f["from_generation"]) for node, f in repairs) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    (last,) = [f for node, f in repairs if node == 1 and f["from_generation"] == 1]
    assert last["job_fallback"] and last["fallback"] == [2]
    # every node says when it stopped repairing: node 1 at once, node 0 at generation 2
    offs = {e.node: e.fields for e in cluster.events("repair_fallback")}
    assert offs[1]["at_generation"] == 1 and offs[0]["at_generation"] == 2
    assert all(f["failed_generations"] == [0, 1] and f["by_node"] == 1 for f in offs.values())
    # rank 0 was kept through generations 0-2 and restarted at the third fault
    assert _entered(cluster, 2, 0)["pid"] == _entered(cluster, 0, 0)["pid"]
    assert finals[0]["pid"] == _entered(cluster, 3, 0)["pid"] != _entered(cluster, 2, 0)["pid"]


def _pids(cluster: LocalCluster, generation: int) -> dict[int, int]:
    return {rank: _entered(cluster, generation, rank)["pid"] for rank in range(4)}


def test_a_survivor_that_dies_while_the_others_park_is_restarted_with_the_failed_one(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 1 (node 0) is killed; rank 3 (node 1) dies when its collective breaks,
    # before it parks: node 1 keeps rank 2 and restarts rank 3 in the same repair
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=kill", PROBE_DIE_ON_BREAK="3")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    first = _pids(cluster, 0)
    assert finals[0]["pid"] == first[0] and finals[2]["pid"] == first[2]
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == [1]
    assert repairs[1]["kept"] == [2] and repairs[1]["restarted"] == [3]
    assert all(r["fallback"] == [] for r in repairs.values())  # a death is no failed repair


def test_a_kept_survivor_that_dies_before_the_next_first_step_is_repaired_again(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 2 (node 1), kept by generation 0's repair, dies on entering generation 1 (its
    # group open, the others in DDP's first broadcast): generation 1 is repaired in turn
    faults = "rank=1,step=10,action=kill;rank=2,step=-1,action=kill,gen=1"
    cluster = _run(tmp_path, PROBE_FAULT=faults)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    first = _pids(cluster, 0)
    assert finals[0]["pid"] == first[0] and finals[3]["pid"] == first[3]
    assert _entered(cluster, 2, 0)["repairs"] == 2
    repairs = {(e.node, e["from_generation"]): e.fields for e in cluster.events("repair")}
    assert repairs[(1, 1)]["kept"] == [3] and repairs[(1, 1)]["restarted"] == [2]
    assert repairs[(0, 1)]["kept"] == [0, 1]


def test_a_parked_survivor_that_dies_before_the_next_generation_does_not_stop_the_job(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 2 (node 1) SIGKILLs itself as soon as it has said "parked". The next
    # generation comes about 0.1 s after the parking and the parked process's killer
    # thread waits for its gc.collect() (which holds the GIL): measured, it died in
    # generation 1 while the others opened its group, which generation 1 cannot repair
    # (its survivors are in init_process_group, not yet repairable): every worker is
    # restarted. Dead before the next start, it is replaced alone. Either way the job
    # goes on and ends as a run without a fault.
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=kill", PROBE_DIE_PARKED="2")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    assert finals[2]["pid"] != _pids(cluster, 0)[2]


def test_a_survivor_stopped_once_it_parked_is_ended_and_never_comes_back(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # rank 2 (node 1) is stopped (SIGSTOP: wedged, a debugger) once its node has counted
    # it as kept, before the next generation's hand-over: it can neither resume nor
    # answer. Its agent ends it (SIGKILL, reaped) before its replacement starts and says
    # so (repair_lost), so it can never enter a later generation as another rank: each
    # hand-over names the process it is for. Had the stop come after the hand-over, it
    # would be the new generation's worker, found hung (--hang-timeout) and repaired.
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*FLAGS, "--hang-timeout=5"],
        conf="join_timeout=60",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        PROBE_FAULT="rank=1,step=10,action=kill",
    )
    stopped = _stop_once_counted(cluster, node=1, rank=2)
    codes = cluster.finish(180)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    assert stopped == _pids(cluster, 0)[2] and finals[2]["pid"] != stopped
    assert not psutil.pid_exists(stopped)  # ended and reaped, not left stopped
    assert finals[3]["pid"] == _pids(cluster, 0)[3]  # the other survivor was kept
    lost = [e.fields for e in cluster.events("repair_lost")]
    hung = [e.fields for e in cluster.events("fault") if e.fields["kind"] == "hang"]
    # the window between the count and the hand-over is about 0.1 s: the test's stop
    # lands in it (measured 3 of 3), or after it (then a hang of generation 1)
    assert lost == [
        {"from_generation": 0, "rank": 2, "pid": stopped, "why": "stopped while parked"}
    ] or (not lost and [h["rank"] for h in hung] == [2]), (lost, hung)


def _stop_once_counted(cluster: LocalCluster, node: int, rank: int) -> int:
    """SIGSTOP `rank`'s first process as soon as `node`'s repair event counts it kept."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        kept = [e.fields["kept"] for e in cluster.events("repair") if e.node == node]
        if kept and rank in kept[0]:
            pid = _entered(cluster, 0, rank)["pid"]
            os.kill(pid, signal.SIGSTOP)
            return pid
        time.sleep(0.002)
    raise AssertionError(f"no repair event kept rank {rank}")


def test_a_runtime_error_of_the_script_fails_only_its_worker_and_is_repaired_in_seconds(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    # torch's OutOfMemoryError is a RuntimeError: the raising rank fails at once (not
    # after every rank waited 30 s for a repair request) and the others are kept
    cluster = _run(tmp_path, PROBE_FAULT="rank=1,step=10,action=raise")
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    for rank in (0, 2, 3):
        assert finals[rank]["pid"] == _entered(cluster, 0, rank)["pid"]
    repairs = {e.node: e.fields for e in cluster.events("repair")}
    assert repairs[0]["kept"] == [0] and repairs[0]["restarted"] == [1]
    assert repairs[1]["kept"] == [2, 3] and not repairs[1]["fallback"]
    (fault,) = [e.fields for e in cluster.events("fault") if e.fields["rank"] == 1]
    assert fault["kind"] == "exit" and not fault["victim"]
    raised = _json(cluster, "fault.json")["t_fault"]
    (start,) = [e for e in cluster.events("generation_start") if e.node == 0 and e.generation == 1]
    assert start.t - raised < 10, start.t - raised  # was 30 s and more
