"""The etcd backend against a real 3-member etcd cluster: training over it, and the
faults it exists for. No node hosts the store, so killing any node, the etcd leader
or one member leaves the job training; losing quorum is waited out within the join
timeout, and a clear error past it."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.cluster import (
    STEPS,
    LocalCluster,
    assert_fenced_and_back,
    assert_same_weights,
    final_records,
    stop_agent_until_gone_on,
)
from tests.integration.helpers import error_lines

FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def _cluster(tmp_path, etcd, nodes: int, nnodes: str, steps: str = STEPS, **kw) -> LocalCluster:
    return LocalCluster(
        tmp_path, nodes, nnodes, ["--nproc-per-node=2", *FAST], etcd=etcd.endpoints,
        PROBE_STEPS=steps, **kw,
    )  # fmt: skip


def status(cluster: LocalCluster) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "rtrain.cli.main", "status", "--rdzv-backend=etcd"]
    argv += [f"--rdzv-endpoint={cluster.etcd}", f"--rdzv-id={cluster.run_id}"]
    return subprocess.run([*argv, "--json", "--timeout=2"], capture_output=True, text=True)


def _finished_like(cluster: LocalCluster, reference: list[float], world: int) -> None:
    final = final_records(cluster)
    assert sorted(final) == list(range(world))
    for rec in final.values():
        assert rec["world_size"] == world and rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)


def test_killing_node_0_leaves_three_nodes_training_on_two(tmp_path, etcd, reference):
    # With TCPStore, node 0's death ends the job (75); over etcd no node is special.
    cluster = _cluster(tmp_path, etcd, 3, "2:3")
    codes = cluster.kill_node_at(5, 0)
    assert codes[1:] == [0, 0], cluster.log(1) + cluster.log(2)
    _finished_like(cluster, reference, 4)
    assert "lost: its lease was not renewed" in cluster.log(1) + cluster.log(2)


def test_two_nodes_train_to_the_reference_weights_through_a_killed_etcd_leader(
    tmp_path, etcd, web_server, reference
):
    # The first endpoint is a web server, not etcd: it is skipped for the real members.
    cluster = LocalCluster(
        tmp_path, 2, "2", ["--nproc-per-node=2", *FAST],
        etcd=f"{web_server},{etcd.endpoints}", PROBE_STEPS=STEPS,
    )  # fmt: skip
    try:
        cluster.wait_progress(5)
        leader = etcd.leader()
        assert leader is not None
        etcd.kill(leader)
        codes = cluster.wait()
    finally:
        cluster.close()
        etcd.restart(leader)
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    _finished_like(cluster, reference, 4)
    assert {gen for gen, _ in cluster.records()} == {0}  # no restart was needed
    assert not any("hosting the rendezvous store" in cluster.log(i) for i in range(2))


def test_lost_quorum_is_waited_out_and_the_job_trains_through_it(tmp_path, etcd, reference):
    cluster = _cluster(tmp_path, etcd, 2, "2", steps="250")
    try:
        cluster.wait_progress(5)
        shown = status(cluster)
        assert shown.returncode == 0, shown.stderr
        assert [n["ranks"] for n in json.loads(shown.stdout)["nodes"]] == [[0, 1], [2, 3]]
        etcd.kill("e1")
        etcd.kill("e2")  # one member of three: no quorum
        before, lost_at = cluster.progress(), time.monotonic()
        blind = status(cluster)  # `rtrain status` says so in one line, and gives up
        assert blind.returncode == 75 and len(error_lines(blind.stderr)) == 1, blind.stderr
        # past the 2 s lease TTL, and past one 5 s request to each member
        time.sleep(max(0.0, 7.0 - (time.monotonic() - lost_at)))
        during = cluster.progress()
        etcd.restart("e1")
        etcd.restart("e2")
        codes = cluster.wait()
    finally:
        cluster.close()
        etcd.restart("e1")
        etcd.restart("e2")
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    assert during > before  # the workers trained on while etcd had no quorum
    assert {gen for gen, _ in cluster.records()} == {0}  # and no lease was lost
    assert "no etcd member answers" in cluster.log(0) + cluster.log(1)


def test_quorum_lost_past_the_join_timeout_is_one_clear_error(tmp_path, etcd):
    cluster = _cluster(tmp_path, etcd, 2, "2", steps="2000", conf="join_timeout=10")
    try:
        cluster.wait_progress(3)
        etcd.kill("e0")
        etcd.kill("e1")
        codes = cluster.wait(timeout=60)
    finally:
        cluster.close()
        etcd.restart("e0")
        etcd.restart("e1")
    assert codes == [75, 75], cluster.log(0)
    for index in range(2):
        last = cluster.log(index).strip().splitlines()[-1]
        assert last.startswith("rtrain: error: etcd unavailable: none of"), last
        assert etcd.endpoints in last  # names every endpoint


def test_a_stopped_agent_past_its_ttl_is_fenced_by_etcd(tmp_path, etcd):
    # The two-node generation cannot finish: the stopped node must come back to end the job.
    cluster = _cluster(tmp_path, etcd, 3, "2:3", steps="60", PROBE_HOLD_WORLD="4")

    def went_on_without_it() -> bool:  # the others started a generation of two nodes
        return any(
            (e.generation or 0) >= 1 and e["nodes"] == 2 for e in cluster.events("generation_start")
        )

    codes, stale_workers = stop_agent_until_gone_on(cluster, 2, went_on_without_it)
    assert codes == [0, 0, 0], cluster.log(2)
    # It learnt that it was fenced (etcd expired its lease, or the round moved on,
    # whichever it read first after SIGCONT); it never rejoined the running collective,
    # and came back at a generation boundary.
    assert "fenced: " in cluster.log(2)
    assert_fenced_and_back(cluster, stale_workers, 60)


def test_an_agent_stopped_until_the_job_finished_without_it_exits_0(tmp_path, etcd):
    """It comes back to a job whose last generation passed its exit barrier: nobody will
    close another round, so it says so and exits 0, not 75 at the join timeout (30 s)."""
    cluster = _cluster(tmp_path, etcd, 3, "2:3")
    try:
        cluster.wait_progress(3)
        cluster.stop_agent(2)
        assert cluster.wait_some([0, 1], 60) == [0, 0], cluster.log(0)
        cluster.cont_agent(2)
        assert cluster.wait(20)[2] == 0, cluster.log(2)
    finally:
        cluster.close()
    ends = {e.agent: e for e in cluster.events("job_end")}
    assert {agent: e["exit_code"] for agent, e in ends.items()} == {
        "127.0.0.1": 0,
        "127.0.0.2": 0,
        "127.0.0.3": 0,
    }
    # The structured end, not the log's last line: the lease keeper's thread may log
    # that etcd fenced the node after the main thread found the job finished.
    # Its workers ran on while it was stopped and finished with the others: it finds
    # either the job's end or its own workers' success first (both exit 0; a loaded
    # fresh-clone CI run saw the second), never the join timeout's 75.
    message = ends["127.0.0.3"]["message"]
    assert "while this node was away" in message or message == "all workers succeeded"


def test_garbage_under_the_jobs_prefix_is_refused_with_one_line(tmp_path, etcd):
    from rtrain.agent.store.etcd.client import EtcdClient

    cluster = _cluster(tmp_path, etcd, 2, "2", steps="2000")
    try:
        cluster.wait_progress(3)
        client = EtcdClient([("127.0.0.1", m.client_port) for m in etcd.members])
        prefix = f"/rtrain/{cluster.run_id}"
        client.put(f"{prefix}/r0/lease/7", "a lease of no member")  # ignored
        client.put(f"{prefix}/r0/lease/1", "garbage")  # a value is not what keeps a lease
        time.sleep(1.0)
        assert all(proc.poll() is None for proc in cluster.procs)
        client.put(f"{prefix}/round", "not a number")
        codes = cluster.wait(timeout=30)
    finally:
        cluster.close()
    assert codes == [75, 75]
    for index in range(2):
        last = cluster.log(index).strip().splitlines()[-1]
        assert last.startswith("rtrain: error: refusing the job's state in the store"), last
        assert "round counter: expected an integer" in last


class _NotEtcd(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b"<html>not here</html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotEtcd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_an_endpoint_that_is_not_etcd_is_named_and_refused(tmp_path, web_server):
    import os

    from tests.integration.helpers import RTRAIN, run

    result = run(
        [
            *RTRAIN, "--rdzv-backend=etcd", f"--rdzv-endpoint={web_server}", "--nnodes=1",
            "--rdzv-conf=join_timeout=5", "-m", "json.tool", "--help",
        ],
        dict(os.environ),
        timeout=30,
    )  # fmt: skip
    assert result.returncode == 75, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rtrain: error: no etcd v3 server at --rdzv-endpoint={web_server}")
    assert "Traceback" not in result.stderr


def test_the_etcd_store_keeps_the_contract_and_its_followers_outlive_eviction(etcd):
    from rtrain.agent.store.etcd import store as etcd_store
    from rtrain.agent.store.etcd.client import EtcdClient
    from rtrain.agent.store.etcd.store import EtcdKeyValueStore
    from rtrain.agent.store.kv import KeyValueStore, increment, wrote

    store = EtcdKeyValueStore(EtcdClient([("127.0.0.1", m.client_port) for m in etcd.members]))
    assert isinstance(store, KeyValueStore)
    p = f"/contract-{time.monotonic_ns()}/"
    assert store.get(p + "k") is None and not store.exists(p + "k")
    store.set(p + "k", "v")
    assert store.set_once(p + "once", "a") == b"a" and store.set_once(p + "once", "b") == b"a"
    assert wrote(store, p + "w", "x") and not wrote(store, p + "w", "y")
    assert store.compare_set(p + "k", "v", "v2") == b"v2"
    assert store.compare_set(p + "k", "wrong", "v3") == b"v2"
    assert store.compare_set(p + "unset", "x", "y") == b"x"  # as TCPStore answers
    assert store.add(p + "n", 3) == 3 and increment(store, p + "n") == 4
    assert store.multi_get([p + "k", p + "n", p + "missing"]) == [b"v2", b"4", None]
    assert store.wait([p + "k"], 0.0) and not store.wait([p + "missing"], 0.0)
    assert store.delete(p + "k") and store.get(p + "k") is None
    round_now = store.follow(p + "round")
    store.set(p + "round", "1")
    assert _eventually(lambda: round_now() == b"1")
    for i in range(etcd_store.MAX_FOLLOWED + 2):  # later generations' keys push it out
        store.follow(f"{p}gen{i}")()
    store.set(p + "round", "2")
    assert _eventually(lambda: round_now() == b"2")  # reopened, not stale
    store.close()


def _eventually(predicate, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_an_add_whose_answer_was_lost_after_it_committed_counts_once(etcd):
    from rtrain.agent.store.etcd.client import EtcdClient
    from rtrain.agent.store.etcd.store import RECEIPT, EtcdKeyValueStore

    class LostAnswers(EtcdClient):
        """The first `lose` txns commit on etcd but their answers are lost: the request
        goes again, as call() sends it to the next member after a timeout."""

        lose = 0

        def call(self, path, body):
            if path == "kv/txn" and self.lose > 0:
                self.lose -= 1
                super().call(path, body)  # committed; the answer never came back
            return super().call(path, body)

    client = LostAnswers([("127.0.0.1", m.client_port) for m in etcd.members])
    store = EtcdKeyValueStore(client)
    key = f"/add-{time.monotonic_ns()}/joins"
    assert store.add(key, 1) == 1
    client.lose = 1
    assert store.add(key, 1) == 2  # before: 3, a phantom slot
    assert store.counter(key) == 2
    client.lose = 1
    assert store.add(key + "-new", 5) == 5 and store.counter(key + "-new") == 5  # created
    receipts = client.range(key + RECEIPT, prefix=True).get("kvs", [])
    assert receipts == []  # each add removes its receipt
    store.close()
