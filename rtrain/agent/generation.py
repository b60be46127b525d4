"""Generation: what one node holds while it runs one generation, how its grid is made,
and how a node is named in it."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from ..core.config.launch_spec import LaunchSpec
from ..core.contract.environment import TOPOLOGY_FILE
from ..core.errors import RendezvousError
from ..core.layout.topology import Layout, NodeSlot, Topology, build_grid, recompute_topology
from ..core.rendezvous.place import Place
from ..core.rendezvous.protocol import MemberInfo, Membership
from .observe.observer import WorkerBeat
from .rendezvous.job import JobRendezvous
from .rendezvous.lease import PeerWatch
from .workers.group import WorkerGroup
from .workers.hang_watch import HangWatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """The last generation this node joined, even one that ended before it started: a
    Place's membership and rank, and the peers' leases to watch, which exist from the
    round's close on (a lost peer is seen before any worker runs). Not a Generation:
    nothing here runs (core/rendezvous/place.py lists the node types)."""

    membership: Membership
    node_rank: int
    peers: PeerWatch

    @property
    def place(self) -> Place:
        return Place(self.membership, self.node_rank)

    @staticmethod
    def member(
        node_id: str, addr: str, nproc: int, requested: int | None, last: Joined | None
    ) -> MemberInfo:
        """What a node says of itself when it joins a round: its rank in `last` if any."""
        previous = last.node_rank if last is not None else None
        return MemberInfo(node_id, addr, nproc, requested_rank=requested, prev_rank=previous)


@dataclass
class Generation:
    """The generation this node runs: what a Joined holds, and what exists only once its
    workers start (their group, their hang watch, the grid); `place` is the pure view of
    it that the parts that do not run it are given (core/rendezvous/place.py lists the
    node types and why each is one)."""

    membership: Membership
    node_rank: int
    group: WorkerGroup
    peers: PeerWatch
    hangs: HangWatch
    topology: Topology
    recycle_plan: dict[str, Any] | None = None  # with --recycle-profile
    worker_store: Any = None  # node 0's: the workers' TCPStore it hosts (else None)

    @property
    def number(self) -> int:
        return self.membership.generation

    @property
    def num_nodes(self) -> int:
        return len(self.membership.members)

    @property
    def place(self) -> Place:
        return Place(self.membership, self.node_rank)

    def beats(self) -> list[WorkerBeat]:
        """Each local worker's global rank and its heartbeat now (count, step), or None
        before its first: what the observer reads of a running generation."""
        return [(w.rank, self.hangs.read(w.local_rank)) for w in self.group.workers]


def previous_grid(
    rdzv: JobRendezvous, layout: Layout, membership: Membership, previous: Generation | None
) -> Topology | None:
    """The grid of the generation before `membership`'s: this node's own, or (joined
    late) rebuilt from the store as every other agent has it."""
    if previous is not None and previous.number == membership.generation - 1:
        return previous.topology
    if membership.generation == 0:
        return None
    last = rdzv.rounds.read_membership(membership.generation - 1)
    return build_grid(
        layout, last.generation, [NodeSlot(m.node_id, m.local_world_size) for m in last.members]
    )


def generation_topology(
    layout: Layout, membership: Membership, before: Topology | None
) -> Topology:
    """This generation's grid; DP peers and lost ranks come from the one before it.

    Every agent computes the same grid from the same memberships, so none is sent around.
    """
    slots = [NodeSlot(m.node_id, m.local_world_size) for m in membership.members]
    return recompute_topology(layout, membership.generation, slots, before)


def write_topology(run_log_dir: str, topology: Topology) -> tuple[str, dict[str, str]]:
    """<run log dir>/attempt_<g>/topology.json, which rtrain.core.topology() reads: its
    folder, and the workers' environment that points at it."""
    folder = os.path.join(run_log_dir, f"attempt_{topology.generation}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "topology.json")
    with open(path, "w") as handle:
        handle.write(topology.encode())
    return folder, {TOPOLOGY_FILE: path}


def default_node_addr(spec: LaunchSpec) -> str:
    """This node's address as peers reach it; torchrun's choice where it makes one."""
    if spec.local_addr:
        return spec.local_addr
    if spec.standalone:
        return "localhost"
    if spec.rdzv.backend == "static" and spec.node_rank == 0:
        return spec.rdzv.host  # node 0 is --master-addr by definition
    return socket.getfqdn()


def membership_rank(membership: Membership, node_id: str) -> int:
    rank = membership.node_rank_of(node_id)
    if rank is None:
        raise RendezvousError(f"this node is not in generation {membership.generation}")
    return rank
