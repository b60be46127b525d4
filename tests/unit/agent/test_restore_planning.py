"""The agent's restore at a generation start, in process: SnapshotService.prepare and
the inventories it pools, against torch's real HashStore behind the typed store."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.restore.restorer import Restorer, RestoreRound
from rtrain.agent.snapshots.service import SnapshotService
from rtrain.agent.snapshots.shard_store import allocate
from rtrain.core.config.component_specs import SnapshotPart
from rtrain.core.config.launch_spec import SnapshotSpec
from rtrain.core.contract.environment import SNAPSHOT_DIR
from rtrain.core.errors import RtrainError
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, encode_master
from rtrain.core.snapshots.format import plan_shard, write_shard
from rtrain.core.snapshots.restore_plan import Reached

from .fakes import launch_spec, memory_store

FLAGS = ("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
MEMBERSHIP = Membership(0, [MemberInfo("a", "127.0.0.1", 1), MemberInfo("b", "127.0.0.2", 1)])
NODES = [NodeSlot("a", 1), NodeSlot("b", 1)]
TOPOLOGY = build_grid(Layout(), 0, NODES)


@pytest.fixture
def service(tmp_path):
    spec = launch_spec(*FLAGS)
    part = SnapshotPart(SnapshotSpec(memory=2**22, copies=1), spec.rdzv.run_id)
    shards = SnapshotService(str(tmp_path), "127.0.0.1", part, secret=b"s")
    rdzv = JobRendezvous.over(memory_store(), spec)
    shards.start(rdzv)
    yield rdzv, shards
    shards.close()


@pytest.mark.parametrize("address", [encode_master("127.0.0.2", 5555), "{forged"])
def test_a_refused_inventory_costs_its_node_only_its_shards(service, address: str) -> None:
    # Before: a peer inventory that did not decode left that node out of the pooled
    # servers too, and prepare() died with KeyError looking up its ring successor.
    rdzv, shards = service
    rdzv.store.set(rdzv.keys.inventory(0, 1), '{"shards": "not a list"')
    rdzv.store.set(rdzv.keys.shards(0, 1), address)
    env = shards.prepare(RestoreRound(MEMBERSHIP, TOPOLOGY, 0, 5.0), 1)
    assert env[SNAPSHOT_DIR].endswith("gen0")
    pooled = _restorer(rdzv, shards).gather(RestoreRound(MEMBERSHIP, TOPOLOGY, 0, 1.0))
    assert pooled.inventory[1] == [] and pooled.reached[1].newest is None
    # The address is judged on its own: a good one is kept for replication.
    assert (1 in pooled.servers) == address.startswith('{"')


def test_a_peer_that_never_publishes_is_a_tempfail_not_a_hang(service) -> None:
    _, shards = service
    with pytest.raises(Exception) as error:
        shards.prepare(RestoreRound(MEMBERSHIP, TOPOLOGY, 0, 0.2), 1)
    assert getattr(error.value, "exit_code", None) == 75
    assert "node 1 did not publish its shards" in str(error.value)


def test_a_step_committed_just_before_the_failure_counts_toward_the_ceiling(service) -> None:
    # Before: only the replicator's polling pass told the service which steps its
    # workers had committed. A worker killed right after a commit left that step
    # unseen, every node published a ceiling one step low, and the whole job
    # restored the step before (found by a fresh-clone CI run).
    rdzv, shards = service
    rdzv.store.set(rdzv.keys.inventory(0, 1), '{"shards": [], "reached": null}')
    rdzv.store.set(rdzv.keys.shards(0, 1), encode_master("127.0.0.2", 5555))
    env = shards.prepare(RestoreRound(MEMBERSHIP, TOPOLOGY, 0, 5.0), 1)
    assert shards._replication is not None
    shards._replication.pause()  # as at a failure: the replicator never gets to look
    layout = plan_shard({"w": torch.ones(4)})
    slot = allocate(os.path.join(env[SNAPSHOT_DIR], "rank0.slot0"), layout.size)
    write_shard(slot, layout, 8)
    later = Membership(1, MEMBERSHIP.members)
    with pytest.raises(RtrainError, match="node 1 did not publish"):
        shards.prepare(RestoreRound(later, build_grid(Layout(), 1, NODES), 0, 0.2), 1)
    published = json.loads(rdzv.store.get(rdzv.keys.inventory(1, 0)))
    assert published["reached"] == 8
    assert [0, 0, 8] in published["shards"]


@pytest.mark.parametrize(
    "forged",
    [
        [[True, 0, 8]],  # a boolean is no generation
        [[0, "0", 8]],  # nor is a string a rank
        [[0, 0, -1]],  # nor a negative step
        [[0, 0]],  # a shard is three numbers
    ],
)
def test_an_inventory_of_the_wrong_shape_is_refused_not_read_as_shards(service, forged) -> None:
    # Before: the inventory was read with int(), which took true for generation 1 and
    # "0" for rank 0, so a forged or garbled record put copies into the plan.
    rdzv, shards = service
    inventory = {"v": 1, "shards": forged, "reached": 8, "every_rank": True}
    rdzv.store.set(rdzv.keys.inventory(0, 1), json.dumps(inventory))
    rdzv.store.set(rdzv.keys.shards(0, 1), encode_master("127.0.0.2", 5555))
    restorer, round_ = _restorer(rdzv, shards), RestoreRound(MEMBERSHIP, TOPOLOGY, 0, 1.0)
    restorer.publish(round_, ("127.0.0.1", 5556), Reached())
    pooled = restorer.gather(round_)
    assert pooled.inventory[1] == [] and pooled.reached[1].newest is None


def _restorer(rdzv: JobRendezvous, shards: SnapshotService) -> Restorer:
    return Restorer(rdzv, shards.store, TcpTransport(b"s", "127.0.0.1"))
