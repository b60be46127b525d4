"""The adapt snapshot policy, job-wide (issue 35), end to end over a real 3-member etcd
cluster: two real nodes meet through etcd (no node hosts a store), one of them slow to
replicate (256 MiB shards against a few KiB), and agree on one interval through etcd's
compare-and-set and watch: both nodes say the same k from the same step, a worker
SIGKILLed after the change restores a step the schedule keeps, and the job ends bitwise
equal to a run without a fault."""

from __future__ import annotations

import json
import os
import signal

import pytest
from rtrain.core.snapshots.interval import Change, Schedule

from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.conftest import SNAPSHOT_FLAGS, SNAPSHOT_STEPS
from tests.integration.test_snapshot_interval import (
    KILLED_RANK,
    SLOW_NODE,
    _job_changes,
    _wait_for,
    _worker_pid,
)

pytestmark = pytest.mark.usefixtures("etcd")

# etcd itself expires a lease not renewed within --heartbeat-timeout: at SNAPSHOT_FLAGS'
# 2 s, a loaded 2-core machine (load 16, 256 MiB shards checksummed) had a node fenced
# and the generation restarted before the interval changed. A worker's SIGKILL is seen
# by its agent at once, whatever the lease.
LEASE_FLAGS = ["--heartbeat-timeout=10", "--max-restarts=1"]
WAIT_S = 90  # for the change, then for the steps past it (a loaded machine's steps)


def test_over_etcd_a_slow_node_sets_one_interval_for_the_job_and_a_kill_restores_it(
    tmp_path, etcd, snapshot_reference
):
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, *LEASE_FLAGS],
        script=SNAPSHOTTING,
        etcd=etcd.endpoints,
        node_env={SLOW_NODE: {"PROBE_STATE_MB": "256"}},
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.05",
        RTRAIN_SNAPSHOT_POLICY="adapt",
    )
    try:

        def raised_on_both() -> bool:
            changes = _job_changes(cluster, 0)
            return set(changes) == {0, 1} and all(
                any(c.interval > 1 for c in v) for v in changes.values()
            )

        _wait_for(cluster, raised_on_both, WAIT_S, "job-wide interval on both nodes")
        (first,) = {changes[0] for changes in _job_changes(cluster, 0).values()}
        _wait_for(
            cluster,
            lambda: cluster.progress() >= first.start + first.interval + 1,
            WAIT_S,
            "progress",
        )
        victim = _worker_pid(cluster, KILLED_RANK)
        done = cluster.progress()
        os.kill(victim, signal.SIGKILL)
        codes = cluster.wait()
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    assert not any("hosting the rendezvous store" in cluster.log(i) for i in range(2))
    changes = _job_changes(cluster, 0)
    assert changes[0] == changes[1], changes  # the same k from the same step everywhere
    schedule = Schedule((Change(0, 1), *changes[0]))
    restored = [json.loads(p.read_text()) for p in cluster.out.glob("restored_gen1_rank*.json")]
    assert len(restored) == 4, cluster.log(0) + cluster.log(1)
    (step,) = {r["step"] for r in restored}
    assert step >= first.start and schedule.due(step), (step, changes)
    newest = [s for s in range(done + 1, -1, -1) if schedule.due(s)][:3]
    assert step in newest, (step, done, changes)
    assert {r["digest"] for r in restored} == {snapshot_reference.steps[step]}
    finals = {json.loads(p.read_text())["digest"] for p in cluster.out.glob("final_*")}
    assert finals == {snapshot_reference.final}
