"""A generation lost mid-restore, after some nodes relabelled their shards and not all:
real agents on localhost nodes, real gloo, FSDP2 saving every step with dcp.save into
rtrain's memory (tests/scripts/train_fsdp2_dcp.py), three nodes of one worker,
--snapshot-copies=3.

Node 2 is killed whole mid-run. In generation 1 (nodes 0 and 1) both publish their
shards and put their ranks' shards in place, relabelled as generation 1's; node 1 then
stops before saying its restore is done (RTRAIN_TEST_STOP_MID_RESTORE, a test-only
hook in agent/snapshots/restorer.py) and is killed whole. Node 0 holds generation 1's
shard of its own rank only; generation 0's shards of every rank it still holds.
Generation 2 (node 0 alone) must restore the step every rank has, generation 1's shard
where one exists and generation 0's carried over where not
(core/snapshots/carry_over.py: fill_in), and its worker's dcp.load reshards 3 -> 1
reading the save's shards where they were written (generation 0). Before, generation 2
counted generation 1's shards only: the load asked for shards nothing holds, and the
job died.

The state loaded equals a run without a fault at that step, and the job ends equal to
a run whose two nodes went at once at that step: the whole state, gathered, sha256,
bitwise. The moments are picked through the progress file, the agents' logs and
process states and their structured events, never a sleep."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
from rtrain.agent.snapshots.restorer import STOP_MID_RESTORE

from tests.integration.cluster import LocalCluster
from tests.integration.test_dcp_skipped_generation import (
    FAULT_AT,
    FLAGS,
    NNODES,
    SCRIPT,
    STEP_SLEEP,
    STEPS,
    _signal_node,
    _wait_for,
    both_at_once,
    check_generation_2_loaded_the_save_from_memory,
    no_fault,
)

__all__ = ["both_at_once", "no_fault"]  # the reference runs, shared fixtures


def _cluster(tmp: Path) -> LocalCluster:
    """The skipped-generation test's cluster, node 1 stopping itself mid-restore in
    generation 1."""
    return LocalCluster(
        tmp,
        3,
        NNODES,
        FLAGS,
        script=SCRIPT,
        node_env={1: {STOP_MID_RESTORE: "1"}},
        PROBE_STEPS=STEPS,
        PROBE_FULL_DIGESTS="1",
        PROBE_STEP_SLEEP=STEP_SLEEP,
    )


def _stopped(cluster: LocalCluster, index: int) -> bool:
    try:
        return psutil.Process(cluster.procs[index].pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def test_a_generation_lost_after_some_nodes_relabelled_restores_every_rank(
    tmp_path: Path, no_fault: Path, both_at_once: LocalCluster
) -> None:
    cluster = _cluster(tmp_path)
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
