"""The adapt snapshot policy, job-wide (issue 35), end to end over a real 3-member etcd
cluster: two real nodes meet through etcd (no node hosts a store), one of them slow to
replicate (256 MiB shards against a few KiB), and agree on one interval through etcd's
compare-and-set and watch: both nodes say the same k from the same step, a worker
SIGKILLed after the change restores a step the schedule keeps, and the job ends bitwise
equal to a run without a fault."""

from __future__ import annotations

import pytest

from tests.integration.test_snapshot_interval import check_one_interval_and_a_kept_restore

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
    cluster = check_one_interval_and_a_kept_restore(
        tmp_path, snapshot_reference, LEASE_FLAGS, WAIT_S, etcd=etcd.endpoints
    )
    assert not any("hosting the rendezvous store" in cluster.log(i) for i in range(2))
