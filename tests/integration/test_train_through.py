"""Train through a fault (rtrain.repairable(train_through=True)), with real agents on two
localhost nodes and real workers over gloo: the survivors train on at once with the
failed rank's data share rerouted, its replacement joins when warm, and every rank ends
bitwise equal to a run without the fault (and to the same script under torchrun)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import ROOT, probe_env, run_torchrun
from tests.integration.shared_runs import once_per_run

SCRIPT = str(ROOT / "tests" / "scripts" / "train_through.py")
STEPS = "400"
FLAGS = ["--nproc-per-node=2", "--max-restarts=3", "--heartbeat-interval=0.5"]
STATUS = [sys.executable, "-m", "rtrain.cli.main", "status"]
REPORT = [sys.executable, "-m", "rtrain.cli.main", "report"]
# Survivors' next step after a crash: the fault seen, the kept ones parked, a round, the
# kept ranks exchanged, an interim group: 0.3 s here unloaded. Not the replacement's
# start-up, which is made 20 s.
NEXT_STEP_S = 3.0


def _run(tmp: Path, flags: list[str] | None = None, **env: str) -> LocalCluster:
    env.setdefault("PROBE_STEP_SLEEP", "0.01")
    env.setdefault("PROBE_STEPS", STEPS)
    cluster = LocalCluster(
        tmp, 2, "2", [*FLAGS, *(flags or [])], conf="join_timeout=60", script=SCRIPT, **env
    )
    codes = cluster.finish(240)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    return cluster


def _finals(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    found = {}
    for rank in range(4):
        path = cluster.out / f"final_rank{rank}.json"
        if path.exists():
            found[rank] = json.loads(path.read_text())
    return found


def _steps(cluster: LocalCluster, rank: int) -> list[dict[str, Any]]:
    path = cluster.out / f"steps_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _fault(cluster: LocalCluster, name: str = "fault.json") -> float:
    return float(json.loads((cluster.out / name).read_text())["t_fault"])


def through_reference(factory: pytest.TempPathFactory) -> str:
    """The digest every rank ends with in a run without a fault (once per test run:
    test_train_through_nodes.py uses the same)."""

    def produce(tmp: Path) -> str:
        cluster = _run(tmp, PROBE_STEP_SLEEP="0")
        digests = {rec["digest"] for rec in _finals(cluster).values()}
        assert len(digests) == 1 and len(_finals(cluster)) == 4
        return digests.pop()

    return str(once_per_run(factory, "train_through_reference", produce))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return through_reference(tmp_path_factory)


def test_the_script_runs_unchanged_under_torchrun_to_the_same_state(
    tmp_path: Path, reference: str
) -> None:
    out = tmp_path / "out"
    env = probe_env(out, PROBE_STEPS=STEPS, PROBE_STEP_SLEEP="0")
    result = run_torchrun(["--standalone", "--nproc-per-node=4", SCRIPT], env, 240)
    assert result.returncode == 0, result.stderr[-3000:]
    finals = [json.loads((out / f"final_rank{r}.json").read_text()) for r in range(4)]
    assert {rec["digest"] for rec in finals} == {reference}


def _status_while_reduced(cluster: LocalCluster) -> tuple[dict[str, Any], str]:
    """`rtrain status` (--json, then the table) once it shows the reduced stretch."""
    argv = [*STATUS, f"--rdzv-endpoint=127.0.0.1:{cluster.port}", f"--rdzv-id={cluster.run_id}"]
    deadline = time.monotonic() + 60
    while not (cluster.out / "fault.json").exists():  # the job runs, its store is up
        assert time.monotonic() < deadline, cluster.log(0)
        time.sleep(0.1)
    while True:
        shown = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        if view["through"] is not None:
            table = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            return view, table.stdout
        assert time.monotonic() < deadline, cluster.log(0)
        time.sleep(0.5)


def test_survivors_train_on_at_once_while_the_replacement_starts_up(
    tmp_path: Path, reference: str
) -> None:
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        FLAGS,
        conf="join_timeout=60",
        script=SCRIPT,
        PROBE_STEPS=STEPS,
        PROBE_FAULT="rank=1,step=10,action=kill",
        PROBE_STARTUP_S="20",
        PROBE_STEP_SLEEP="0.06",
    )
    try:
        view, table = _status_while_reduced(cluster)
    except BaseException:
        cluster.close()
        raise
    assert cluster.finish(240) == [0, 0], cluster.log(0) + cluster.log(1)
    # rtrain status, while the replacement warmed up: the job at 3 of 4 ranks
    through = view["through"]
    assert (through["kept"], through["joining"], through["full"]) == ([0, 2, 3], [1], False)
    assert through["shares"]["2"] == [1, 2]
    assert "training at 3 of 4 ranks, rank 1's share on rank 2, rank 1 joining" in table
    t_fault = _fault(cluster)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == dict.fromkeys(
        range(4), reference
    )
    for rank in (0, 2, 3):
        steps = _steps(cluster, rank)
        assert {s["pid"] for s in steps} == {finals[rank]["pid"]}  # one process throughout
        after = [s for s in steps if s["t"] > t_fault]
        assert after[0]["t"] - t_fault < NEXT_STEP_S, (after[0], t_fault)
        assert after[0]["world"] == 3 and after[0]["generation"] == 1
        # the full size again, in the same generation, once the replacement was warm
        assert after[-1]["world"] == 4 and after[-1]["generation"] == 1
    # rank 1's share went to rank 2 (the next round the ring) while it was missing
    interim = [s for s in _steps(cluster, 2) if s["world"] == 3]
    assert interim and all(s["logical"] == [1, 2] for s in interim)
    joined = _steps(cluster, 1)
    new = [s for s in joined if s["t"] > t_fault]
    assert new[0]["t"] - t_fault >= 20 and new[0]["step"] == interim[-1]["step"] + 1
    (repair,) = [e.fields for e in cluster.events("repair") if e.node == 0]
    assert repair["kept"] == [0] and repair["restarted"] == [1]
    # each node says when its kept ranks trained on reduced, and when at full size again
    through = {e.node: e for e in cluster.events("train_through")}
    full = {e.node: e for e in cluster.events("full_size")}
    assert sorted(through) == sorted(full) == [0, 1]
    for node in (0, 1):
        assert through[node]["kept"] == [0, 2, 3] and through[node]["joining"] == [1]
        assert through[node]["shares"]["2"] == [1, 2] and through[node].generation == 1
        assert through[node].t - t_fault < NEXT_STEP_S
        assert full[node]["reduced_s"] >= 20 - NEXT_STEP_S
    assert full[0]["joined"] == [1] and full[1]["joined"] == []
    # rtrain report: the stretch at 3 of 4 ranks as its own cause, not lost time
    report = subprocess.run(
        [*REPORT, str(tmp_path / "logs"), "--json"], capture_output=True, text=True, timeout=60
    )
    assert report.returncode == 0, report.stderr
    (reduced,) = json.loads(report.stdout)["reduced"]
    assert (reduced["generation"], reduced["ranks"], reduced["world"]) == (1, 3, 4)
    assert reduced["seconds"] >= 20 - NEXT_STEP_S
    assert reduced["reduced_throughput_s"] == pytest.approx(reduced["seconds"] / 4, rel=0.01)


def test_a_hung_worker_is_trained_around_after_the_hang_timeout(
    tmp_path: Path, reference: str
) -> None:
    cluster = _run(
        tmp_path,
        ["--hang-timeout=3"],
        PROBE_FAULT="rank=1,step=10,action=stop",
        PROBE_STARTUP_S="4",
    )
    t_fault = _fault(cluster)
    assert {rec["digest"] for rec in _finals(cluster).values()} == {reference}
    after = [s for s in _steps(cluster, 0) if s["t"] > t_fault]
    assert after[0]["world"] == 3 and after[0]["t"] - t_fault < 3 + NEXT_STEP_S
    assert after[-1]["world"] == 4


@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_a_replacement_that_fails_in_its_start_up_costs_the_survivors_no_restart(
    tmp_path: Path, reference: str, fault: str
) -> None:
    """crash: the agent tries again (a new generation, the same kept processes); hang:
    the survivors finish the training without it, and it ends with the job."""
    cluster = _run(
        tmp_path,
        [],
        PROBE_FAULT="rank=1,step=10,action=kill",
        PROBE_STARTUP_S="1",
        PROBE_STARTUP_FAULT=fault,
    )
    finals = _finals(cluster)
    for rank in (0, 2, 3):
        assert finals[rank]["digest"] == reference
        assert {s["pid"] for s in _steps(cluster, rank)} == {finals[rank]["pid"]}
    if fault == "crash":  # the second replacement joined
        assert finals[1]["digest"] == reference
        assert _steps(cluster, 0)[-1]["world"] == 4
    else:
        assert 1 not in finals and _steps(cluster, 0)[-1]["world"] == 3


def test_a_second_fault_while_the_replacement_warms_up_still_ends_equal(
    tmp_path: Path, reference: str
) -> None:
    cluster = _run(
        tmp_path,
        PROBE_FAULT="rank=1,step=10,action=kill;rank=3,step=30,action=kill,gen=1",
        PROBE_STARTUP_S="3",
    )
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == dict.fromkeys(
        range(4), reference
    )
    t_second = _fault(cluster, "fault1.json")
    after = [s for s in _steps(cluster, 2) if s["t"] > t_second]
    assert after[0]["t"] - t_second < NEXT_STEP_S and after[0]["world"] == 2
    assert after[-1]["world"] == 4
