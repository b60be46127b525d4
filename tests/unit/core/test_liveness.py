"""Staleness of leases and heartbeats, and restart accounting (pure, clock handed in)."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtrain.core.errors import UsageError
from rtrain.core.rendezvous.liveness import LEASE_WATCHERS, StalenessTracker, watched_peers
from rtrain.core.rendezvous.restart_budget import RestartBudget
from tests.unit.core.test_launch_spec import spec_of


def test_a_lease_is_stale_after_timeout_without_a_change():
    tracker: StalenessTracker[int] = StalenessTracker(5.0)
    tracker.observe(1, 7, now=100.0)
    tracker.observe(1, 8, now=103.0)
    tracker.observe(1, 8, now=107.9)
    assert tracker.stale(107.9) == []
    assert tracker.stale(108.1) == [1]
    tracker.observe(1, 9, now=108.2)  # renewed: alive again
    assert tracker.stale(108.2) == []


def test_a_lease_never_written_counts_from_the_first_look():
    tracker: StalenessTracker[int] = StalenessTracker(2.0)
    tracker.observe(3, None, now=0.0)
    assert tracker.stale(2.5) == [3]


def test_a_heartbeat_only_counts_after_the_first_call():
    tracker: StalenessTracker[int] = StalenessTracker(2.0, armed_by_first_change=True)
    tracker.observe(0, 0, now=0.0)
    assert tracker.stale(100.0) == []  # never called heartbeat(): liveness only
    tracker.observe(0, 1, now=100.0)
    assert tracker.stale(101.0) == [] and tracker.stale(102.5) == [0]
    assert tracker.silent_for(0, 102.5) == pytest.approx(2.5)


def test_restart_budget_refunds_a_restart_when_a_node_was_lost():
    budget = RestartBudget(max_restarts=1)
    budget.charge(0)
    assert budget.exhausted
    assert budget.settle({"a", "b"}, {"a"}, 1)  # node b is gone: not this node's fault
    assert budget.used == 0 and not budget.exhausted
    budget.charge(1)
    assert not budget.settle({"a"}, {"a"}, 2)  # same nodes: the charge stands
    assert budget.exhausted


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tp=0"], "--tp: expected a positive integer"),
        (["--pp=x"], "--pp: expected a non-negative integer"),
        (["--tp=3", "--nproc-per-node=4"], "--tp=3 must divide --nproc-per-node=4"),
        (["--pp=8", "--nproc-per-node=2"], "needs 8 workers"),
        (["--heartbeat-interval=5", "--heartbeat-timeout=2"], "must be longer than"),
        (["--hang-timeout=-1"], "--hang-timeout: expected a positive number"),
        (["--max-node-failures=-2"], "--max-node-failures: expected a non-negative"),
        (["--health-interval=-1"], "--health-interval: expected a number >= 0"),
        (["--health-interval=soon"], "--health-interval: expected a number >= 0"),
        (["--health-interval=nan"], "--health-interval: expected a number >= 0"),
    ],
)
def test_fault_and_layout_flags_are_validated(argv, fragment):
    with pytest.raises(UsageError, match=fragment):
        spec_of(*argv, "train.py")


def test_fault_flags_defaults_and_rdzv_conf_heartbeat_timeout():
    spec = spec_of("train.py")
    assert spec.faults.heartbeat_interval == 1.0 and spec.faults.heartbeat_timeout == 5.0
    assert spec.faults.hang_timeout == 60.0 and spec.faults.max_node_failures == 0
    assert spec.health.interval == 10.0 and not spec.health.drain_on_fault
    spec = spec_of("--health-interval=0", "--drain-on-fault", "t.py")
    assert spec.health.interval == 0.0 and spec.health.drain_on_fault
    spec = spec_of("--rdzv-conf=heartbeat_timeout=9", "--tp=2", "--nproc-per-node=4", "t.py")
    assert spec.faults.heartbeat_timeout == 9.0 and spec.layout.tp == 2


def test_a_heartbeat_made_before_the_first_look_arms_the_watch():
    tracker: StalenessTracker[int] = StalenessTracker(2.0, armed_by_first_change=True, initial=0)
    tracker.observe(0, 1, now=0.0)  # the worker beat once before the agent first looked
    assert tracker.stale(1.0) == [] and tracker.stale(2.5) == [0]


def test_restart_delay_is_immediate_once_then_doubles_to_the_cap():
    from rtrain.core.rendezvous.restart_budget import RESTART_BACKOFF_CAP_S, restart_delay

    assert [restart_delay(n, 1.0) for n in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 4.0]
    assert restart_delay(50, 1.0) == RESTART_BACKOFF_CAP_S and restart_delay(5, 0.0) == 0.0


def test_a_small_job_watches_every_peer():
    assert watched_peers(1, 4) == [0, 2, 3]
    assert watched_peers(0, 2) == [1] and watched_peers(0, 1) == []


@given(st.integers(LEASE_WATCHERS + 2, 5000), st.data())
def test_every_node_has_its_watchers_and_watches_as_many(num_nodes, data):
    watchers = collections.Counter(
        peer for node in range(num_nodes) for peer in watched_peers(node, num_nodes)
    )
    assert set(watchers) == set(range(num_nodes))
    assert set(watchers.values()) == {LEASE_WATCHERS}
    node = data.draw(st.integers(0, num_nodes - 1))
    assert node not in watched_peers(node, num_nodes)


@given(st.integers(LEASE_WATCHERS + 2, 3000), st.data())
def test_a_block_of_consecutive_ranks_under_a_third_leaves_each_a_live_watcher(num_nodes, data):
    """A rack or a switch (ranks follow hosts): every node lost in it is still seen."""
    size = data.draw(st.integers(1, max(1, num_nodes // LEASE_WATCHERS - 1)))
    start = data.draw(st.integers(0, num_nodes - 1))
    block = {(start + i) % num_nodes for i in range(size)}
    live = [n for n in range(num_nodes) if n not in block]
    seen = {peer for node in live for peer in watched_peers(node, num_nodes)}
    assert block <= seen


def test_a_rank_outside_the_job_is_refused():
    with pytest.raises(ValueError, match="not in a job of 3"):
        watched_peers(3, 3)
