"""GPU faults in a running job: each node's agent reads its own fake NVML scenario
(RTRAIN_FAKE_NVML), and the fault fires when the test touches a trigger file, at a
step it chose. Everything above pynvml (reader, monitor, verdicts, the agent's
reaction, the other nodes' recovery) is the real code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.cluster import STEPS, LocalCluster, assert_same_weights, final_records
from tests.integration.helpers import RTRAIN, error_lines, probe_env, run

FAST = ["--nproc-per-node=2", "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]
HEALTH = ["--health-interval=0.5"]
NODE_UNHEALTHY = 77


def scenario(tmp: Path, name: str, gpu0: dict[str, Any] | None = None) -> dict[str, str]:
    """A two-GPU node whose GPU 0 follows `gpu0` (healthy when None)."""
    path = tmp / f"{name}.json"
    gpus = [{"uuid": f"GPU-{name}-0", **(gpu0 or {})}, {"uuid": f"GPU-{name}-1"}]
    path.write_text(json.dumps({"gpus": gpus}))
    return {"RTRAIN_FAKE_NVML": str(path)}


def faulty_cluster(
    tmp: Path, sick: int, fault: dict[str, Any], flags: list[str] | None = None, nodes: int = 2
):
    """`nodes` nodes; node `sick`'s GPU 0 gets `fault` once the returned trigger exists."""
    trigger = tmp / "trigger"
    node_env = {
        i: scenario(tmp, f"node{i}", {"timeline": [{"after_file": str(trigger), **fault}]})
        if i == sick
        else scenario(tmp, f"node{i}")
        for i in range(nodes)
    }
    cluster = LocalCluster(
        tmp,
        nodes,
        f"1:{nodes}",
        [*FAST, *HEALTH, *(flags or [])],
        node_env=node_env,
        PROBE_STEPS=STEPS,
    )
    return cluster, trigger


def fire_mid_training(cluster: LocalCluster, trigger: Path) -> list[int | None]:
    """Touch the trigger at step 5 and wait for every node's exit code."""
    try:
        cluster.wait_progress(5)
        trigger.touch()
        return cluster.wait()
    finally:
        cluster.close()


def assert_finished_alone(cluster: LocalCluster, reference: list[float], world: int) -> None:
    final = final_records(cluster)
    assert len(final) == world
    for rec in final.values():
        assert rec["world_size"] == world and rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)


def test_xid_79_takes_the_node_out_and_the_others_finish(tmp_path, reference):
    cluster, trigger = faulty_cluster(tmp_path, 1, {"xid": 79})
    codes = fire_mid_training(cluster, trigger)
    assert codes == [0, NODE_UNHEALTHY], cluster.log(0) + cluster.log(1)
    gpu = [e for e in cluster.events("gpu") if e.agent == "127.0.0.2" and e["findings"]]
    assert gpu[0]["verdict"] == "critical" and "XID 79" in gpu[0]["findings"][0]
    (fault,) = [e for e in cluster.events("fault") if e["kind"] == "unhealthy_gpu"]
    assert (fault["kind"], fault["host"], fault["rank"]) == ("unhealthy_gpu", "127.0.0.2", None)
    assert "-> reboot node" in fault["message"]
    ends = {e.agent: e["exit_code"] for e in cluster.events("job_end")}
    assert ends == {"127.0.0.1": 0, "127.0.0.2": NODE_UNHEALTHY}
    assert_finished_alone(cluster, reference, world=2)
    # the node said it was leaving: nobody waited for its lease to run out
    assert "lease was not renewed" not in cluster.log(0)
    assert any(gen > 0 for gen, _ in cluster.records())  # it left mid-training


def test_a_pending_row_remap_found_by_sampling_takes_the_node_out(tmp_path, reference):
    cluster, trigger = faulty_cluster(tmp_path, 1, {"readings": {"remapped_rows": [0, 1, 1, 0]}})
    codes = fire_mid_training(cluster, trigger)
    assert codes == [0, NODE_UNHEALTHY], cluster.log(0) + cluster.log(1)
    assert "row_remap: row remap pending" in cluster.log(1) and "-> reset GPU" in cluster.log(1)
    assert_finished_alone(cluster, reference, world=2)


def test_xid_13_restarts_the_workers_and_the_node_stays(tmp_path, reference):
    cluster, trigger = faulty_cluster(tmp_path, 1, {"xid": 13}, ["--max-restarts=1"])
    codes = fire_mid_training(cluster, trigger)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    sick = cluster.log(1)
    assert "restarting the workers: GPU 0 (GPU-node1-0): xid: XID 13" in sick
    assert "restarting the job (1 of 1 restarts used)" in sick  # charged like a crash
    assert "leaving the job" not in sick
    final = final_records(cluster)
    assert len(final) == 4 and max(g for g, _ in cluster.records()) >= 1
    for rec in final.values():
        assert_same_weights(rec["weights"], reference)
    # the finding is in the recovery report, with its kind
    assert "unhealthy_gpu" in cluster.log(0) + sick


def test_a_node_that_fails_its_checks_before_joining_stays_out(tmp_path, reference):
    sick = scenario(tmp_path, "node1", {"readings": {"recovery_action": 2}})  # reboot needed
    cluster = LocalCluster(
        tmp_path,
        2,
        "1:2",
        [*FAST, *HEALTH],
        conf="join_timeout=30,last_call_timeout=1",  # node 0 starts without waiting for it
        node_env={0: scenario(tmp_path, "node0"), 1: sick},
        PROBE_STEPS=STEPS,
    )
    codes = cluster.finish()
    assert codes == [0, NODE_UNHEALTHY], cluster.log(0) + cluster.log(1)
    assert "GPU check before joining" in cluster.log(1)
    assert "driver asks for: node reboot" in cluster.log(1)
    assert {rec["world_size"] for rec in cluster.records().values()} == {2}
    assert_finished_alone(cluster, reference, world=2)


def test_the_store_host_leaves_but_keeps_the_store_until_the_others_finish(tmp_path, reference):
    cluster, trigger = faulty_cluster(tmp_path, 0, {"xid": 48})
    codes = fire_mid_training(cluster, trigger)
    assert codes == [NODE_UNHEALTHY, 0], cluster.log(0) + cluster.log(1)
    assert "keeping it up until the job ends" in cluster.log(0)
    assert "XID 48 (double-bit ECC error)" in cluster.log(0)
    assert_finished_alone(cluster, reference, world=2)


def test_drain_on_fault_outside_slurm_is_a_usage_error(tmp_path):
    env = {**probe_env(tmp_path / "out"), **scenario(tmp_path, "node0")}
    env.pop("SLURMD_NODENAME", None)
    done = run([*RTRAIN, "--standalone", "--drain-on-fault", "-m", "json.tool", "--help"], env)
    assert done.returncode == 64
    assert error_lines(done.stderr) == [
        "rtrain: error: --drain needs Slurm: SLURMD_NODENAME is not set on this node"
    ]
