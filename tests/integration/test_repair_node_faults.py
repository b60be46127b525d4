"""Node faults during a repair in place (rtrain.repairable), real agents on localhost
nodes, real gloo, three active nodes (--nnodes 2:3) and standbys beyond them:

- a standby SIGKILLed while it takes a lost node's rank (as the round that takes it
  closes, or once its worker entered generation 1): the next standby takes the rank;
- a node SIGKILLed or SIGSTOPped whole while the survivors of a worker's fault are
  parked: a standby takes its rank in the repaired generation.

A node lost as the next generation starts ends that generation before its restore,
which relabels no shard: the one after restores the older shards, carried over
(agent/snapshots/restorer.py; before, it found none and started from scratch). Each
moment is picked through the agents' structured events (or the worker's entry file),
never a sleep, and every job ends bitwise equal to the three ranks' run without a
fault."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rtrain.core.observe.events import Event
from tests.integration.cluster import LocalCluster
from tests.integration.test_standby_takeover import (
    FLAGS,
    NNODES,
    STEPS,
    _cluster,
    _forked_ahead,
    _json,
    _pid,
    _wait_for,
    three_nodes_reference,
)

STANDBYS = (3, 4)  # the standbys' node indexes (127.0.0.4, 127.0.0.5)


def _agent(index: int) -> str:
    return f"127.0.0.{index + 1}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's digest after a run of the three active nodes without a fault (the
    standby tests' run, once per test run)."""
    return three_nodes_reference(tmp_path_factory)


def _add_standbys(cluster: LocalCluster, *indexes: int) -> None:
    """Start nodes `indexes` once the job runs, one after the other (each joins before
    the next starts: the first takes the first lost node's rank), and wait until they
    wait as standbys, the first with its worker's process forked ahead."""
    _wait_for("round 0's close", lambda: bool(cluster.events("generation_start")), cluster)
    for index in indexes:
        cluster.start_node(index, NNODES, FLAGS)
        log = lambda i=index: "joined round 1" in cluster.log(i)  # noqa: E731
        _wait_for(f"node {index}'s join", log, cluster)
    first = indexes[0]
    _wait_for("its fork ahead", lambda: bool(_forked_ahead(cluster, first)), cluster)


def _event_of(
    cluster: LocalCluster, name: str, match: Callable[[Event], bool], timeout: float = 60
) -> Event:
    """The first `name` event that `match`es, waited for (polled, bounded)."""
    end = time.monotonic() + timeout
    while True:
        found = [e for e in cluster.events(name) if match(e)]
        if found:
            return found[0]
        assert time.monotonic() < end, f"never saw a matching {name} event:\n" + cluster.log(0)
        time.sleep(0.02)


def _finals(cluster: LocalCluster) -> dict[int, dict]:
    return {rank: _json(cluster, f"final_rank{rank}.json") for rank in range(3)}


@pytest.mark.parametrize("moment", ["joining", "restoring"])
def test_a_standby_lost_while_it_takes_over_is_replaced_by_the_next_one(
    tmp_path: Path, reference: dict[int, str], moment: str
) -> None:
    """joining: the standby goes as the survivors are parked (it is in the round that
    closes without node 1); restoring: once its worker entered the training function
    in generation 1 (its group open, its restore next)."""
    taker, second = STANDBYS
    cluster = _cluster(tmp_path)
    try:
        _add_standbys(cluster, taker, second)
        cluster.wait_progress(2)
        assert cluster.progress() < int(STEPS) - 5  # the fault comes mid-run
        cluster.kill_node(1)
        if moment == "joining":
            _event_of(cluster, "repair", lambda e: e.agent == _agent(0) and e.generation == 0)
        else:
            taking = _event_of(
                cluster, "restore", lambda e: e.agent == _agent(taker) and e.generation == 1
            )
            assert taking.node == 1  # it took node 1's rank in generation 1
            entered = (cluster.out / "enter_gen1_rank1.json").exists
            _wait_for("its worker's entry", entered, cluster)
        cluster.kill_node(taker)
        codes = cluster.wait_some([0, 2, second], 180)
    finally:
        cluster.close()
    assert codes == [0, 0, 0], cluster.log(0) + cluster.log(2) + cluster.log(second)
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    assert all(rec["world"] == 3 for rec in finals.values())
    # the second standby took node rank 1 in the generation after
    last = max(e.generation for e in cluster.events("generation_start"))
    starts = {e.agent: e for e in cluster.events("generation_start") if e.generation == last}
    assert starts[_agent(second)].node == 1
    assert starts[_agent(second)]["members"] == [_agent(0), _agent(second), _agent(2)]
    assert last == 2 and starts[_agent(0)].node == 0 and starts[_agent(2)].node == 2
    # The survivors keep their processes, parked through generation 1 if it never
    # started, repaired again if it did. Not if it started and the standby went before
    # its worker joined the group: a survivor inside init_process_group is restarted
    # (README, "Repair in place"), which only the joining moment may meet.
    started_1 = {e.agent for e in cluster.events("generation_start") if e.generation == 1}
    for rank in (0, 2):
        kept = finals[rank]["pid"] == _pid(cluster, 0, rank)
        assert kept or (moment == "joining" and _agent(rank) in started_1)
        if _agent(rank) not in started_1:
            assert kept


def _signal_node(cluster: LocalCluster, index: int, sig: signal.Signals) -> None:
    """`sig` to node `index` whole: its agent, pool and workers."""
    for pid in cluster.node_pids(index):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_node_lost_while_the_survivors_are_parked_is_taken_over_by_a_standby(
    tmp_path: Path, reference: dict[int, str], sig: signal.Signals
) -> None:
    cluster = _cluster(tmp_path)
    try:
        _add_standbys(cluster, STANDBYS[0])
        cluster.wait_progress(2)
        assert cluster.progress() < int(STEPS) - 5  # the faults come mid-run
        os.kill(_pid(cluster, 0, 2), signal.SIGKILL)  # node 2's worker: a repair starts
        # the survivors are parked (their repair events) and node 1 is in the next
        # round, which closes with it: node 1 goes, whole, as that generation starts
        for node in (0, 1):
            _event_of(
                cluster, "repair", lambda e, n=node: e.agent == _agent(n) and e.generation == 0
            )
        _wait_for("node 1's join", lambda: "joined round 1" in cluster.log(1), cluster)
        _signal_node(cluster, 1, sig)
        codes = cluster.wait_some([0, 2, STANDBYS[0]], 180)
    finally:
        cluster.close()
    assert codes == [0, 0, 0], cluster.log(0) + cluster.log(2) + cluster.log(STANDBYS[0])
    finals = _finals(cluster)
    assert {rank: rec["digest"] for rank, rec in finals.items()} == reference
    assert all(rec["world"] == 3 for rec in finals.values())
    last = max(e.generation for e in cluster.events("generation_start"))
    starts = {e.agent: e for e in cluster.events("generation_start") if e.generation == last}
    assert starts[_agent(STANDBYS[0])].node == 1  # the standby took the lost node's rank
    assert starts[_agent(0)].node == 0 and starts[_agent(2)].node == 2
    assert finals[2]["pid"] != _pid(cluster, 0, 2)  # node 2's failed worker was replaced
    # node 0's survivor kept its process: parked through generation 1, which ended as
    # it started (node 1 was in its round), unless node 1 went only once generation 1's
    # restore was through (the survivor may then be caught in init_process_group)
    started_1 = {e.agent for e in cluster.events("generation_start") if e.generation == 1}
    if _agent(0) not in started_1:
        assert finals[0]["pid"] == _pid(cluster, 0, 0)
