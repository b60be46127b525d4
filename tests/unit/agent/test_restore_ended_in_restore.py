"""Which generations a restore fills in from older shards (agent/snapshots/restore/restorer.py):
one that ended in its restore (some node said how its attempt went, no attempt was done
on every member: its workers never started, its shards are relabelled copies), never
one whose restore was done everywhere or that made no plan (its workers may have
written shards of their own), read from torch's real HashStore behind the typed store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtrain.agent.rendezvous.job import JobRendezvous
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.restore.restorer import Restorer
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.rendezvous.protocol import MemberInfo, Membership
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.snapshots.restore_records import RestoreOutcome

from .fakes import launch_spec, memory_store

FLAGS = ("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400")
A, B = MemberInfo("a", "127.0.0.1", 1), MemberInfo("b", "127.0.0.2", 1)
# node 0 holds generation 1's shard of rank 0 only (rank 1's went with node 1)
PARTIAL = {0: [ShardId(1, 0, 5), ShardId(0, 0, 5), ShardId(0, 1, 5)], 1: []}


@pytest.mark.parametrize(
    ("outcomes", "ended"),
    [
        ({}, False),  # no plan was made: fresh or from disk, its workers ran
        ({(0, 0): True}, True),  # node 1 lost before saying how its attempt went
        ({(0, 0): True, (0, 1): True}, False),  # done everywhere
        ({(0, 0): True, (0, 1): False, (1, 0): True, (1, 1): True}, False),  # at the 2nd
        ({(0, 0): True, (0, 1): False, (1, 0): True}, True),  # lost in the 2nd attempt
        ({(0, 0): False, (0, 1): False}, True),  # lost before a 2nd attempt
    ],
    ids=["no-plan", "lost-in-it", "done", "done-2nd", "lost-in-2nd", "lost-between"],
)
def test_a_generation_ended_in_its_restore_when_no_attempt_was_done_everywhere(
    tmp_path: Path, outcomes: dict[tuple[int, int], bool], ended: bool
) -> None:
    rdzv = JobRendezvous.over(memory_store(), launch_spec(*FLAGS))
    rdzv.store.set(rdzv.keys.closed(1), Membership(1, [A, B]).encode())
    for (attempt, node), complete in outcomes.items():
        key = rdzv.keys.restore_outcome(1, node, attempt)
        rdzv.store.set(key, RestoreOutcome(complete).encode())
    restorer = Restorer(rdzv, ShardStore(str(tmp_path), 2**20), TcpTransport(b"s", "127.0.0.1"))
    assert restorer._ended_in_restore(1, PARTIAL) is ended


def test_a_generation_holding_a_step_of_every_rank_is_never_filled_in(tmp_path: Path) -> None:
    rdzv = JobRendezvous.over(memory_store(), launch_spec(*FLAGS))
    rdzv.store.set(rdzv.keys.closed(1), Membership(1, [A, B]).encode())
    rdzv.store.set(rdzv.keys.restore_outcome(1, 0, 0), RestoreOutcome(True).encode())
    restorer = Restorer(rdzv, ShardStore(str(tmp_path), 2**20), TcpTransport(b"s", "127.0.0.1"))
    whole = {0: [ShardId(1, 0, 5)], 1: [ShardId(1, 1, 5)]}
    assert restorer._ended_in_restore(1, whole) is False
