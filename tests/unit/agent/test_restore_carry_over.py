"""A generation that ended before its restore (a member lost while it started): the
next generation restores the older shards, carried over to its ranks, in process
(SnapshotService.prepare against torch's real HashStore behind the typed store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.snapshots.restore.restorer import RestoreRound
from rtrain.agent.snapshots.service import SnapshotService
from rtrain.agent.snapshots.shard_store import allocate
from rtrain.core.config.component_specs import SnapshotPart
from rtrain.core.config.launch_spec import SnapshotSpec
from rtrain.core.contract.environment import SNAPSHOT_DIR
from rtrain.core.errors import RtrainError
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.rendezvous.protocol import MemberInfo, Membership
from rtrain.core.snapshots.format import plan_shard, write_shard

from .fakes import launch_spec, memory_store

FLAGS = ("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
A, B = MemberInfo("a", "127.0.0.1", 1), MemberInfo("b", "127.0.0.2", 1)
A_AGAIN = MemberInfo("a", "127.0.0.1", 1, prev_rank=0)


@pytest.mark.parametrize("destroyed", [False, True], ids=["kept", "destroyed"])
def test_a_generation_that_ended_before_its_restore_leaves_its_shards_to_the_next(
    tmp_path: Path, destroyed: bool
) -> None:
    # Before: generation 1 (a and b; b never published: lost as it started) relabeled
    # nothing, generation 2 planned over generation 1's shards only, found none, and
    # its workers started from scratch (test_repair_node_faults: a node lost while
    # the survivors of a repair were parked ended the job with other weights). With
    # the shards gone, it started from scratch too, silently: generation 1's restore
    # had forgotten which steps a's workers committed, so nothing said they existed.
    spec = launch_spec(*FLAGS)
    part = SnapshotPart(SnapshotSpec(memory=2**22, copies=1), spec.rdzv.run_id)
    shards = SnapshotService(str(tmp_path), "127.0.0.1", part, b"s")
    rdzv = JobRendezvous.over(memory_store(), spec)
    shards.start(rdzv)
    try:
        memberships = [Membership(0, [A]), Membership(1, [A, B]), Membership(2, [A_AGAIN])]
        grids = [build_grid(Layout(), 0, [NodeSlot("a", 1)])]
        for membership in memberships:
            rdzv.store.set(rdzv.keys.closed(membership.generation), membership.encode())
            if membership.generation:
                slots = [NodeSlot(m.node_id, 1) for m in membership.members]
                grids.append(recompute_topology(Layout(), membership.generation, slots, grids[-1]))
        env = shards.prepare(RestoreRound(memberships[0], grids[0], 0, 5.0), 1)
        layout = plan_shard({"w": torch.ones(4)})
        path = os.path.join(env[SNAPSHOT_DIR], "rank0.slot0")
        write_shard(allocate(path, layout.size), layout, 8)
        with pytest.raises(RtrainError, match="node 1 did not publish"):
            shards.prepare(RestoreRound(memberships[1], grids[1], 0, 0.2), 1)
        if destroyed:
            os.remove(path)
            with pytest.raises(RtrainError, match="refusing to start from scratch"):
                shards.prepare(RestoreRound(memberships[2], grids[2], 0, 5.0), 1)
            return
        shards.prepare(RestoreRound(memberships[2], grids[2], 0, 5.0), 1)
        assert shards.restored_step == 8
    finally:
        shards.close()
