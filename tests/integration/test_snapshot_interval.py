"""The adapt snapshot policy, job-wide (issue 35): real agents on two localhost nodes,
one of them slow to replicate (its workers' shards are 256 MiB, the other node's a few
KiB, so its checksums and sends take longer than a step), agree on one interval: every
node says the same k from the same step, every rank keeps those steps, and a worker
SIGKILLed after the change restores a step every rank kept, ending bitwise equal to a
run without failures."""

from __future__ import annotations

import json
import os
import signal
import time

from rtrain.core.snapshots.interval import Change, Schedule
from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.conftest import SNAPSHOT_FLAGS, SNAPSHOT_STEPS

SLOW_NODE = 1
KILLED_RANK = 3  # on the slow node


def _job_changes(
    cluster: LocalCluster, generation: int, before: float = float("inf")
) -> dict[int, list[Change]]:
    """Each node's job-wide interval changes in `generation`, as its events say (those
    written before the wall-clock time `before`)."""
    found: dict[int, list[Change]] = {}
    for event in cluster.events("snapshot_interval"):
        if event.generation == generation and event.get("scope") == "job" and event.t < before:
            changes = found.setdefault(event.node, [])
            change = Change(event["step"], event["interval"])
            if change not in changes:
                changes.append(change)
    return found


def _wait_for(cluster: LocalCluster, predicate, timeout: float, what: str) -> None:
    """Until predicate() holds, bounded, and only while the job runs."""
    end = time.monotonic() + timeout
    while not predicate():
        running = any(proc.poll() is None for proc in cluster.procs)
        assert running and time.monotonic() < end, (
            f"no {what} within {timeout:g}s\n" + cluster.log(0) + cluster.log(1)
        )
        time.sleep(0.05)


def test_a_slow_node_sets_one_interval_for_the_job_and_a_kill_restores_a_kept_step(
    tmp_path, snapshot_reference
):
    check_one_interval_and_a_kept_restore(tmp_path, snapshot_reference, ["--max-restarts=1"], 60)


def check_one_interval_and_a_kept_restore(
    tmp_path, snapshot_reference, flags: list[str], wait_s: float, **cluster_args
) -> LocalCluster:
    """The scenario, asserted (also over etcd: test_snapshot_interval_etcd.py): the slow
    node raises the job's interval, both nodes hand it over, a worker of the slow node
    is SIGKILLed past the change and restores a kept step. The cluster, closed, for the
    caller's own checks."""
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, *flags],
        script=SNAPSHOTTING,
        node_env={SLOW_NODE: {"PROBE_STATE_MB": "256"}},
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.05",
        RTRAIN_SNAPSHOT_POLICY="adapt",
        **cluster_args,
    )
    try:
        # The slow node's want raises the job's interval; both nodes hand it over.
        def raised_on_both() -> bool:
            changes = _job_changes(cluster, 0)
            return set(changes) == {0, 1} and all(
                any(c.interval > 1 for c in v) for v in changes.values()
            )

        _wait_for(cluster, raised_on_both, wait_s, "job-wide interval on both nodes")
        (first,) = {changes[0] for changes in _job_changes(cluster, 0).values()}
        # Past the change's start and its next kept step: then a worker of the slow node
        # dies (SIGKILL, as a crash).
        _wait_for(
            cluster,
            lambda: cluster.progress() >= first.start + first.interval + 1,
            wait_s,
            "progress",
        )
        victim = _worker_pid(cluster, KILLED_RANK)
        done = cluster.progress()
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        codes = cluster.wait()
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    changes = _job_changes(cluster, 0)
    # the same k from the same step everywhere, as long as both nodes ran generation 0:
    # a change agreed after the kill reaches only the node whose generation went on
    # (seen once in a loaded CI run: node 0 alone recorded a second raise)
    agreed = _job_changes(cluster, 0, before=killed_at)
    assert agreed[0] == agreed[1], changes
    schedule = Schedule((Change(0, 1), *changes[0]))
    # (Which node asked for it varies: on two cores the fast node's replicas to the slow
    # one, busy with 256 MiB shards, are late too. Every node applies the largest.)
    # Every rank restored one step, one the job's schedule keeps, bitwise that step's
    # state, and the job ended as a run without failures.
    restored = [json.loads(p.read_text()) for p in cluster.out.glob("restored_gen1_rank*.json")]
    assert len(restored) == 4, cluster.log(0) + cluster.log(1)
    (step,) = {r["step"] for r in restored}
    assert step >= first.start and schedule.due(step), (step, changes)
    # ... the newest one every rank had committed, or the one before it (a rank still
    # waiting in snapshot() for its last replication as the kill came), as under wait.
    newest = [s for s in range(done + 1, -1, -1) if schedule.due(s)][:3]
    assert step in newest, (step, done, changes)
    assert {r["digest"] for r in restored} == {snapshot_reference.steps[step]}
    finals = {json.loads(p.read_text())["digest"] for p in cluster.out.glob("final_*")}
    assert finals == {snapshot_reference.final}
    return cluster


def _worker_pid(cluster: LocalCluster, rank: int) -> int:
    """The pid of the worker of global rank `rank`: the process under the agent (which
    maps every slot of its node) that maps that rank's slots."""
    import psutil

    for pid in cluster.node_pids(SLOW_NODE)[1:]:
        try:
            maps = psutil.Process(pid).memory_maps()
        except psutil.Error:
            continue
        if any(f"/rank{rank}.slot" in m.path for m in maps):
            return pid
    raise AssertionError(f"no worker of rank {rank} on node {SLOW_NODE}")
