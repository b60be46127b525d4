"""A frozen etcd member (SIGSTOPped: it still accepts connections, and answers none),
against a real 3-member cluster. A killed member refuses connections at once; a frozen
one made every request that tried it first wait a whole attempt (5 s), as long as the
lease, so every node's lease lapsed in the same second and the job restarted, charging
a healthy node. Requests and keep-alives now leave a member within a quarter of the
lease, nodes start on different members, and a lapse that hits every node at once
declares none of them lost. The member is always resumed (SIGCONT) in teardown."""

from __future__ import annotations

import base64
import time
from contextlib import contextmanager

import pytest

from tests.integration.cluster import STEPS, LocalCluster, assert_same_weights, final_records

pytestmark = pytest.mark.usefixtures("etcd")

TTL = 2.0
INTERVAL = 0.5
# The jobs' lease: 3 s, not the 2 s of test_etcd.py, whose agents on a loaded 2-core
# machine sometimes miss a renewal while they start a generation, frozen member or not.
JOB_TTL = 3.0
JOB_FLAGS = [
    "--nproc-per-node=2",
    f"--heartbeat-interval={INTERVAL:g}",
    f"--heartbeat-timeout={JOB_TTL:g}",
]
SLACK_S = 0.4  # a loaded 2-core machine's scheduling, on top of the bound


def _follower(etcd) -> str:
    leader = etcd.leader()
    assert leader is not None
    return next(m.name for m in etcd.members if m.name != leader)


def _ordered(etcd, first: str, at: int) -> list:
    """The members in an order that puts `first` at index `at`."""
    others = [m for m in etcd.members if m.name != first]
    members = others[:]
    members.insert(at, etcd.member(first))
    return members


def _eventually(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@contextmanager
def _frozen(etcd, name: str):
    etcd.pause(name)
    try:
        yield
    finally:
        etcd.resume(name)


def test_a_client_whose_first_member_is_frozen_answers_within_a_third_of_the_lease(etcd):
    from rtrain.agent.rendezvous.etcd_leases import EtcdLeases
    from rtrain.agent.store.backends import ETCD_ATTEMPT_S
    from rtrain.agent.store.etcd.client import EtcdClient
    from rtrain.agent.store.etcd.store import EtcdKeyValueStore
    from rtrain.core.rendezvous.protocol import StoreKeys

    frozen = _follower(etcd)
    members = _ordered(etcd, frozen, 0)
    # As the agent opens it (open_etcd): 5 s per attempt on one member.
    client = EtcdClient([("127.0.0.1", m.client_port) for m in members], attempt_s=ETCD_ATTEMPT_S)
    store = EtcdKeyValueStore(client)
    keys = StoreKeys(f"frozen-{time.monotonic_ns()}")
    leases = EtcdLeases(store, keys, TTL, INTERVAL)
    try:
        leases.hold(0, 0)
        assert store.get(keys.lease(0, 0)) is not None
        assert _eventually(lambda: leases.renewed_at() is not None)  # the keeper runs
        bound = TTL / 3 + SLACK_S
        slowest, gap = 0.0, 0.0
        with _frozen(etcd, frozen):
            end = time.monotonic() + 3 * TTL  # frozen well past the lease
            while time.monotonic() < end:
                began = time.monotonic()
                store.set(keys.prefix + "/probe", str(began))
                assert store.get(keys.prefix + "/probe") == str(began).encode()
                slowest = max(slowest, time.monotonic() - began)
                renewed = leases.renewed_at()
                assert renewed is not None
                gap = max(gap, time.monotonic() - renewed)
                assert leases.lapsed() is None, "the lease lapsed behind a frozen member"
                time.sleep(0.05)
            assert store.get(keys.lease(0, 0)) is not None  # etcd kept the lease
        assert slowest <= bound, f"a request took {slowest:.2f}s with a frozen member"
        # renewed every interval, each renewal within a third of the lease
        assert gap <= INTERVAL + bound, f"{gap:.2f}s without a renewal"
    finally:
        leases.close()
        store.close()


def test_a_member_frozen_past_the_lease_leaves_the_job_training(tmp_path, etcd, reference):
    from rtrain.agent.store.etcd.members import first_member

    # Node 0 (127.0.0.1) tries this follower first; the other node another member.
    frozen = _follower(etcd)
    members = _ordered(etcd, frozen, first_member("127.0.0.1", len(etcd.members)))
    endpoints = ",".join(m.endpoint for m in members)
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        JOB_FLAGS,
        etcd=endpoints,
        PROBE_STEPS=STEPS,
        PROBE_STEP_SLEEP="0.25",  # the job outlasts the freeze; the weights do not change
    )
    try:
        cluster.wait_progress(5)
        before = cluster.progress()
        with _frozen(etcd, frozen):
            time.sleep(2 * JOB_TTL)  # the fault itself: frozen for two leases
            during = cluster.progress()
        codes = cluster.wait()
    finally:
        etcd.resume(frozen)
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    assert during > before  # trained on while the member was frozen
    starts = cluster.events("generation_start")
    assert {e.generation for e in starts} == {0}, [e.fields for e in starts]  # no restart
    assert cluster.events("fault") == []  # nobody declared lost, nobody charged
    final = final_records(cluster)
    assert sorted(final) == [0, 1, 2, 3] and all(r["applied"] == int(STEPS) for r in final.values())
    for rec in final.values():  # bitwise the weights of the run without a fault
        assert_same_weights(rec["weights"], reference)


def test_a_lapse_that_hits_every_node_at_once_declares_none_and_one_alone_is_declared(etcd):
    """Two nodes' leases, each with its own client, as two agents hold them. etcd ends
    both leases at once (revoked together: what expiry does when every keep-alive
    stalls), then, in a new generation, one of them alone."""
    from rtrain.agent.rendezvous.etcd_leases import EtcdLeases
    from rtrain.agent.store.etcd.client import EtcdClient
    from rtrain.agent.store.etcd.store import EtcdKeyValueStore
    from rtrain.core.rendezvous.protocol import StoreKeys

    endpoints = [("127.0.0.1", m.client_port) for m in etcd.members]
    keys = StoreKeys(f"lapse-{time.monotonic_ns()}")
    stores = [EtcdKeyValueStore(EtcdClient(endpoints)) for _ in range(2)]
    nodes = [EtcdLeases(store, keys, TTL, INTERVAL) for store in stores]
    admin = EtcdClient(endpoints)

    def lease_of(generation: int, node: int) -> int:
        value = admin.range(keys.lease(generation, node)).get("kvs", [])
        return int(base64.b64decode(value[0]["value"])) if value else 0

    try:
        for node, leases in enumerate(nodes):
            leases.hold(0, node)
        peers = [leases.peers(0, node, 2) for node, leases in enumerate(nodes)]
        assert _eventually(lambda: all(p.stale() == [] and p._seen for p in peers))
        for node in range(2):
            admin.revoke(lease_of(0, node))
        # each finds its own lease gone, and declares nobody for it
        assert _eventually(lambda: all(leases.lapsed() == 0 for leases in nodes))
        for _ in range(3):
            assert [p.stale() for p in peers] == [[], []]
            time.sleep(INTERVAL)  # keep-alives of the new leases come and go meanwhile
        assert [p.stale() for p in peers] == [[], []]

        for node, leases in enumerate(nodes):
            leases.hold(1, node)
        peers = [leases.peers(1, node, 2) for node, leases in enumerate(nodes)]
        assert _eventually(lambda: all(p.stale() == [] and p._seen for p in peers))
        admin.revoke(lease_of(1, 1))  # node 1 alone
        assert _eventually(lambda: peers[0].stale() == [1], timeout=TTL)
        assert _eventually(lambda: nodes[1].lapsed() == 1)
        assert nodes[0].lapsed() == 0  # node 0's lease held through generation 1
    finally:
        for leases in nodes:
            leases.close()
        for store in stores:
            store.close()
        admin.close()


def test_every_agent_stopped_past_its_lease_restarts_the_job_with_no_node_declared_lost(
    tmp_path, etcd
):
    """Every node's lease lapses in the same stall (all agents SIGSTOPped until etcd
    deleted every lease key): each finds itself fenced, the job restarts, and no node
    is declared lost (before: each declared the other, both charged)."""
    from rtrain.agent.store.etcd.client import EtcdClient

    cluster = LocalCluster(tmp_path, 2, "2", JOB_FLAGS, etcd=etcd.endpoints, PROBE_STEPS="120")
    admin = EtcdClient([("127.0.0.1", m.client_port) for m in etcd.members])
    leases = f"/rtrain/{cluster.run_id}/r0/lease/"
    try:
        cluster.wait_progress(5)
        try:
            for node in range(2):
                cluster.stop_agent(node)
            assert _eventually(lambda: not admin.range(leases, prefix=True).get("kvs"), 20)
        finally:
            for node in range(2):
                cluster.cont_agent(node)
        codes = cluster.wait()
    finally:
        cluster.close()
        admin.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    for node in range(2):
        assert "fenced: etcd expired this node's lease" in cluster.log(node)
    assert [e.fields for e in cluster.events("fault") if e["kind"] == "lost_node"] == []
    assert {e.generation for e in cluster.events("generation_start")} == {0, 1}
    final = final_records(cluster)
    assert sorted(final) == [0, 1, 2, 3] and all(r["applied"] == 120 for r in final.values())
