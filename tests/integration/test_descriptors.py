"""File descriptors: a flood on --metrics-port cannot exhaust the agent's, and an agent
that runs out of them anyway (a full table, whatever took it) logs it and restarts its
part of the job instead of dying with a traceback. Both jobs end bitwise like the run
without the fault."""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import time

import psutil
import pytest

from rtrain.agent.observe.metrics_http import MAX_CONNECTIONS
from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.conftest import SNAPSHOT_FLAGS, SNAPSHOT_STEPS
from tests.integration.helpers import HeldPort

pytestmark = pytest.mark.integration

SLOW_STEPS = {"PROBE_STEP_SLEEP": "0.2"}  # the digests do not depend on the pause


def _finals(cluster: LocalCluster) -> set[str]:
    paths = list(cluster.out.glob("final_rank*.json"))
    assert len(paths) == 4, paths
    return {json.loads(p.read_text())["digest"] for p in paths}


def _limit_descriptors(pid: int, soft: int) -> None:
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_clients_on_the_metrics_port_do_not_take_the_node_down(
    tmp_path, snapshot_reference
) -> None:
    """300 idle clients against node 0's metrics port, its agent limited to 64
    descriptors more than it holds, then one of its workers killed: before the cap the clients
    held a thread and a descriptor each and the restart died with EMFILE."""
    held = HeldPort()  # each node serves its metrics on it, at its own address
    port = held.port
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, "--max-restarts=3", f"--metrics-port={port}"],
        script=SNAPSHOTTING,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.5",  # the flood takes seconds: the job must outlast it
    )
    clients: list[socket.socket] = []
    try:
        cluster.wait_progress(3)
        agent = cluster.procs[0].pid
        _limit_descriptors(agent, psutil.Process(agent).num_fds() + 64)
        threads = psutil.Process(agent).num_threads()
        for _ in range(300):
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break  # the listen queue is full: the flood is as big as it gets
        # A scrape from another address is answered, after every earlier connection
        # was accepted (the listen queue is served in order).
        scrape = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=10, source_address=("127.0.0.2", 0)
        )
        scrape.request("GET", "/metrics")
        assert scrape.getresponse().status == 200
        scrape.close()
        # Held: MAX_PER_SOURCE connections, a thread each, with room for the agent's own
        # threads that come and go (before: a thread per client until the descriptors
        # ran out, some 64 here).
        assert psutil.Process(agent).num_threads() <= threads + MAX_CONNECTIONS
        # A restart under the flood: node 0's first worker is killed.
        assert cluster.progress() < int(SNAPSHOT_STEPS), "the job ended before the fault"
        os.kill(cluster.node_pids(0)[2], signal.SIGKILL)
        assert cluster.wait(120) == [0, 0], cluster.log(0)
    finally:
        for client in clients:
            client.close()
        cluster.close()
        held.close()
    assert _finals(cluster) == {snapshot_reference.final}
    assert [e.agent for e in cluster.events("fault") if not e.get("victim")] == ["127.0.0.1"]
    assert "ran out of file descriptors" not in cluster.log(0)
    assert "\nTraceback" not in "\n" + cluster.log(0)  # the agent's own; workers' are [rankN]


def test_an_agent_out_of_descriptors_restarts_its_part_and_the_job_ends_equal(
    tmp_path, snapshot_reference
) -> None:
    """Node 1's agent is held far below the descriptors it has (every open fails with
    EMFILE, wherever it is: the replicator's thread, the shard server, the restart after
    its worker is killed) until its generation loop says so; given them back, the job
    goes on and ends bitwise like the run without the fault."""
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, "--max-restarts=3"],
        script=SNAPSHOTTING,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_FAULT="rank=3,step=8,action=kill",
        **SLOW_STEPS,
    )
    try:
        cluster.wait_progress(3)
        agent = cluster.procs[1].pid
        soft, _ = resource.prlimit(agent, resource.RLIMIT_NOFILE)
        _limit_descriptors(agent, 16)
        end = time.monotonic() + 60
        while "ran out of file descriptors" not in cluster.log(1):
            assert cluster.procs[1].poll() is None, cluster.log(1)
            assert time.monotonic() < end, cluster.log(1)
            time.sleep(0.05)
        _limit_descriptors(agent, soft)
        assert cluster.wait(120) == [0, 0], cluster.log(1)
    finally:
        cluster.close()
    assert _finals(cluster) == {snapshot_reference.final}
    assert "\nTraceback" not in "\n" + cluster.log(1)  # the agent's own; workers' are [rankN]
