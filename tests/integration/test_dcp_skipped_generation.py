"""A resharding DCP load after a generation that restored nothing or only in part, real
agents on localhost nodes, real gloo, FSDP2 saving every step with dcp.save into
rtrain's memory (tests/scripts/train_fsdp2_dcp.py), three nodes of one worker,
--snapshot-copies=3. Both scenarios share the two reference runs (module fixtures: one
file, so they run once).

A generation skipped. Node 2 is killed whole mid-run; node 1 is stopped (SIGSTOP,
whole) once it joined the next round, so generation 1 closes with it and ends before
its restore: it relabels no shard. Generation 2 (node 0 alone) restores generation 0's
shards carried over generation 1 (agent/snapshots/restore/restorer.py) and its worker's
dcp.load reshards 3 -> 1, reading the other two writers' shards through its agent
(prefetch and on-demand fetches). Before, those were named as generation 1's (the
generation before the load's), which nothing holds: the prefetch failed, the load's
own request failed, and the job died. Now they name generation 0, where the save was
written.

A generation lost mid-restore, after some nodes relabelled their shards and not all.
Node 2 is killed whole mid-run. In generation 1 (nodes 0 and 1) both publish their
shards and put their ranks' shards in place, relabelled as generation 1's; node 1 then
stops before saying its restore is done (RTRAIN_TEST_STOP_MID_RESTORE, a test-only
hook in agent/snapshots/restore/restorer.py) and is killed whole. Node 0 holds generation 1's
shard of its own rank only; generation 0's shards of every rank it still holds.
Generation 2 (node 0 alone) must restore the step every rank has, generation 1's shard
where one exists and generation 0's carried over where not
(core/snapshots/carry_over.py: fill_in), and its worker's dcp.load reshards 3 -> 1
reading the save's shards where they were written (generation 0). Before, generation 2
counted generation 1's shards only: the load asked for shards nothing holds, and the
job died.

The state loaded equals the state of a run without a fault at that step, and the job
ends equal to a run whose two nodes went at once at the same step (no generation
skipped): the whole state, gathered, sha256, bitwise. The moments are picked through
the progress file, the agents' logs and their structured events, never a sleep."""

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

from rtrain.agent.snapshots.restore.restorer import STOP_MID_RESTORE
from tests.integration.cluster import SNAPSHOTTING, LocalCluster

SCRIPT = str(Path(SNAPSHOTTING).with_name("train_fsdp2_dcp.py"))
FLAGS = [
    "--nproc-per-node=1",
    "--heartbeat-interval=0.5",
    "--heartbeat-timeout=2",
    "--snapshot-copies=3",
]
NNODES, STEPS, FAULT_AT = "1:3", "10", 4
# Long enough that the kill lands while every rank sleeps after the step the progress
# file names (the step every rank committed is then that one).
STEP_SLEEP = "0.6"


def _cluster(tmp: Path, node_env: dict[int, dict[str, str]] | None = None) -> LocalCluster:
    return LocalCluster(
        tmp,
        3,
        NNODES,
        FLAGS,
        script=SCRIPT,
        node_env=node_env,
        PROBE_STEPS=STEPS,
        PROBE_FULL_DIGESTS="1",
        PROBE_STEP_SLEEP=STEP_SLEEP,
    )


def _wait_for(
    what: str, done: Callable[[], bool], cluster: LocalCluster, timeout: float = 90
) -> None:
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, f"never saw {what}:\n" + cluster.log(0)
        time.sleep(0.01)


def _signal_node(cluster: LocalCluster, index: int, sig: signal.Signals) -> None:
    for pid in cluster.node_pids(index):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            os.kill(pid, sig)


def _digest(cluster: LocalCluster, step: int) -> str:
    return (cluster.out / f"full_step{step}.txt").read_text()


def _loads(cluster: LocalCluster) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in cluster.out.glob("restored_gen*.json")}


@pytest.fixture(scope="module")
def no_fault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of the three nodes' run without a fault (full_step<S>.txt)."""
    cluster = _cluster(tmp_path_factory.mktemp("no_fault"))
    codes = cluster.finish(180)
    assert codes == [0, 0, 0], cluster.log(0)
    return cluster.out


@pytest.fixture(scope="module")
def both_at_once(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    """Nodes 1 and 2 killed together after step FAULT_AT - 1: node 0 reshards 3 -> 1
    in the generation right after (nothing skipped) and trains on alone."""
    cluster = _cluster(tmp_path_factory.mktemp("both_at_once"))
    try:
        cluster.wait_progress(FAULT_AT, timeout=120)
        cluster.kill_node(1)
        cluster.kill_node(2)
        codes = cluster.wait_some([0], 180)
    finally:
        cluster.close()
    assert codes == [0], cluster.log(0)
    return cluster


def test_a_resharding_load_after_a_generation_that_restored_nothing_reads_the_right_save(
    tmp_path: Path, no_fault: Path, both_at_once: LocalCluster
) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.wait_progress(FAULT_AT, timeout=120)
        cluster.kill_node(2)
        # node 1 joins the next round (its worker lost its peer), which then closes
        # with it: stopped now, it never publishes its shards, and generation 1 ends
        # before its restore once its lease runs out
        _wait_for("node 1's join", lambda: "joined round 1" in cluster.log(1), cluster)
        _signal_node(cluster, 1, signal.SIGSTOP)
        codes = cluster.wait_some([0], 180)
    finally:
        cluster.close()
    assert codes == [0], cluster.log(0)
    check_generation_2_loaded_the_save_from_memory(cluster, no_fault, both_at_once)


def check_generation_2_loaded_the_save_from_memory(
    cluster: LocalCluster, no_fault: Path, both_at_once: LocalCluster
) -> None:
    """Generation 1 restored nothing (node 0 restored in generations 0, fresh, and 2);
    generation 2's load read the save from peers' memory, bitwise the run without a
    fault at that step, and the job ended as the one whose nodes went together then."""
    mine = [e for e in cluster.events("restore") if e.agent == "127.0.0.1"]
    assert sorted(e.generation for e in mine) == [0, 2], cluster.log(0)
    (restore,) = [e for e in mine if e.generation == 2]
    assert restore.fields["source"] == "memory", cluster.log(0)
    assert restore.fields["from_dp_peer"] == 0, cluster.log(0)
    loads = _loads(cluster)
    assert sorted(loads) == ["restored_gen2"], cluster.log(0)
    loaded = loads["restored_gen2"]
    assert loaded["world"] == 1 and loaded["step"] == FAULT_AT - 1, loaded
    # the state loaded is the run without a fault's at that step, bitwise
    assert loaded["digest"] == (no_fault / f"full_step{loaded['step']}.txt").read_text()
    # the other writers' shards came from the agent, named by the save's generation:
    # every prefetch got them, and no on-demand request failed
    prefetches = [e for e in cluster.events("prefetch") if e.generation == 2]
    assert prefetches and all(e.fields["failed"] == 0 for e in prefetches), cluster.log(0)
    assert all(e.fields["failed"] == 0 for e in cluster.events("shard_request"))
    # and the job ends as the one whose nodes went together at the same step
    (reference,) = _loads(both_at_once).values()
    assert reference["step"] == loaded["step"] and reference["digest"] == loaded["digest"]
    last = int(STEPS) - 1
    assert _digest(cluster, last) == _digest(both_at_once, last)


def _stopped(cluster: LocalCluster, index: int) -> bool:
    try:
        return psutil.Process(cluster.procs[index].pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def test_a_generation_lost_after_some_nodes_relabelled_restores_every_rank(
    tmp_path: Path, no_fault: Path, both_at_once: LocalCluster
) -> None:
    cluster = _cluster(tmp_path, node_env={1: {STOP_MID_RESTORE: "1"}})
    try:
        cluster.wait_progress(FAULT_AT, timeout=120)
        cluster.kill_node(2)
        # node 1 stops itself once its shard is in place, before saying so: node 0,
        # which saw its inventory, relabels its own and waits for it
        _wait_for("node 1 stopped mid-restore", lambda: _stopped(cluster, 1), cluster)
        _signal_node(cluster, 1, signal.SIGKILL)
        codes = cluster.wait_some([0], 180)
    finally:
        cluster.close()
    assert codes == [0], cluster.log(0)
    # node 1 stopped past its own shard's placing: node 0, whose inventory it had read,
    # had put its own in place, relabelled into generation 1, with no wait between
    assert "stopping this agent mid-restore" in cluster.log(1)
    # generation 1's restore never ended: the same outcome as a skipped generation's
    check_generation_2_loaded_the_save_from_memory(cluster, no_fault, both_at_once)
