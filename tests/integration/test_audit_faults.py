"""The audit's fault scenarios, injected for real against multi-node jobs on localhost:
a flipped byte in the copy a restore would choose, a stopped store host, a neighbour
job in another PID namespace sharing /dev/shm, a full shared-memory file system.
Each ends with the training state of a run without the fault, or with a clear error."""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from dataclasses import dataclass

import pytest

from tests.integration.cluster import SNAPSHOTTING, LocalCluster

FAST = ["--nproc-per-node=2", "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]
STEPS = "30"


def digests(cluster: LocalCluster) -> set[str]:
    return {json.loads(p.read_text())["digest"] for p in cluster.out.glob("final_rank*.json")}


@dataclass
class Reference:
    final: str  # parameters and Adam state at the end of a 2 x 2 run with no fault
    steps: dict[int, str]  # ... and after each step


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    tmp = tmp_path_factory.mktemp("reference")
    cluster = LocalCluster(
        tmp, 2, "2", FAST, script=SNAPSHOTTING, PROBE_STEPS=STEPS, PROBE_STEP_DIGESTS="1"
    )
    try:
        assert cluster.wait() == [0, 0], cluster.log(0)
    finally:
        cluster.close()
    (found,) = digests(cluster)
    steps = {
        int(p.stem.removeprefix("digest_step")): p.read_text()
        for p in cluster.out.glob("digest_step*.txt")
    }
    return Reference(found, steps)


def restored(cluster: LocalCluster) -> list[dict]:
    return [json.loads(p.read_text()) for p in cluster.out.glob("restored_*.json")]


def replica_files(agent_pid: int, rank: int) -> list[tuple[int, str]]:
    """(step, path) of the replicas of `rank` the agent keeps, newest first."""
    found = []
    for path in glob.glob(f"/dev/shm/rtrain-run-{agent_pid}-*/shards/replica/g0_r{rank}.rep*"):
        with open(path, "rb") as handle:
            step = struct.unpack_from("<q", handle.read(64), 16)[0]
        found.append((step, path))
    return sorted(found, reverse=True)


def test_a_corrupt_newest_copy_costs_one_step_not_the_run(tmp_path, reference):
    cluster = LocalCluster(
        tmp_path, 2, "2", FAST, script=SNAPSHOTTING, PROBE_STEPS=STEPS, PROBE_STEP_SLEEP="0.1"
    )
    try:
        cluster.wait_progress(8)
        cluster.kill_node(1)
        # Node 1's shards now live only as replicas on node 0: flip a byte in the
        # newest one of rank 2, the copy the restore plan would choose.
        (newest, path), *_ = replica_files(cluster.procs[0].pid, 2)
        with open(path, "r+b") as handle:
            handle.seek(os.path.getsize(path) - 100)
            byte = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([byte[0] ^ 0xFF]))
        time.sleep(1.0)
        cluster.start_node(1, "2", FAST)
        codes = cluster.wait()
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert codes == [0, 0], logs
    assert "failed its checksum" in logs
    assert "planning again" in logs
    # Every rank resumed at one step, no more than one before the corrupt copy's, with
    # the model and optimizer state a run without the fault had at that step. (When a
    # DP peer's shard of a newer step stands in for the corrupt one, the rank takes
    # the peer's RNG state too, so the runs part ways after it: that is DP fallback.)
    records = restored(cluster)
    (step,) = {r["step"] for r in records}
    assert step >= newest - 1, logs
    assert {r["digest"] for r in records} == {reference.steps[step]}
    if "from a DP peer" not in logs:
        assert digests(cluster) == {reference.final}
