"""The job's TCPStore lost with its host's pod and back at the same name
(agent/kube/store_return.py, issue 37 item 3): which losses are waited out, and what is
carried over to the new store; a node waiting in round 0 of the new store goes to the
round the survivors carried the job to. On emulated pods:
tests/integration/test_kubernetes_faults.py::test_the_store_hosts_pod_replaced."""

from __future__ import annotations

from rtrain.agent.kube.store_return import StoreReturn
from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.core.errors import RendezvousTimeout, StoreUnavailable
from rtrain.core.rendezvous.protocol import MemberInfo, Membership

from .fakes import FakeClock, launch_spec, memory_store

KUBE = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
FLAGS = ("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=tj-node-0-0.tj:29400")


def member(n: int) -> MemberInfo:
    return MemberInfo(node_id=f"id{n}", addr=f"10.244.0.{n}", local_world_size=1)


def test_only_a_lost_tcpstore_hosted_by_another_pod_is_waited_out() -> None:
    lost = StoreUnavailable("lost the rendezvous store")
    tcp = StoreReturn(launch_spec(*FLAGS), KUBE)
    assert tcp.waits_for(lost, hosted_here=False)
    assert not tcp.waits_for(lost, hosted_here=True)
    assert not tcp.waits_for(RendezvousTimeout("too few nodes", 0), hosted_here=False)
    assert not StoreReturn(launch_spec(*FLAGS), {}).waits_for(lost, hosted_here=False)
    etcd = ("--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=etcd:2379")
    assert not StoreReturn(launch_spec(*etcd), KUBE).waits_for(lost, hosted_here=False)


def test_the_job_is_carried_over_to_the_new_store_and_a_waiting_node_follows() -> None:
    clock = FakeClock()
    store = memory_store()
    rdzv = JobRendezvous.over(store, launch_spec(*FLAGS), clock.clock)
    survivor = StoreReturn(launch_spec(*FLAGS), KUBE)
    last = Membership(3, (member(1), member(2)))
    survivor.lost(last, b"the-job-secret")

    def survivors_arrive() -> None:
        survivor.carry_over(JobRendezvous.over(store, launch_spec(*FLAGS), clock.clock))
        slot = store.add(rdzv.keys.joins(4), 1)
        store.set(rdzv.keys.slot(4, slot), member(2).encode())

    # the replacement of the store's host waits in round 0 of its fresh store
    clock.at(2.0, survivors_arrive)
    membership = rdzv.rounds.join(member(3))
    assert membership.generation == 4  # generation numbers only grow
    assert sorted(m.node_id for m in membership.members) == ["id2", "id3"]
    assert rdzv.rounds.read_membership(3) == last  # the grid before it, for everyone
    assert store.get(rdzv.keys.secret) == b"the-job-secret"
