"""Place: this node's place in one generation, its membership and its node rank: what
the parts that do not run the generation (the job's end, the observer, the fault
policy) are given, instead of the agent's Generation.

The types that describe a node, and why each is its own (each is the one before it
plus what exists only later, or a narrower view for a narrower reader):

- protocol.MemberInfo: what one agent announces when it joins a round (the wire, before
  any rank is given);
- protocol.Membership: the round once closed, the same on every node;
- Place (here): one node's Membership and node rank; pure, so that core and the parts
  of the agent that only read a generation need nothing of the running one;
- agent/generation.Joined: a Place's two fields and the peers' leases (PeerWatch: I/O),
  from the round's close on, even for a generation that ended before it started;
- agent/generation.Generation: all that, and what exists only once the workers run
  (their group, their hang watch, the grid);
- core/layout/topology.NodeSlot: a node as the grid sees it (its id and worker count),
  so that the layout never depends on the rendezvous protocol;
- core/config/worker_env.NodeAssignment: a node's ranks as numbers (rank offset, world
  size), what the workers' environment is written from.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import Membership


@dataclass(frozen=True)
class Place:
    """A node's membership and rank in one generation, and nothing that runs: what the
    job's end and the observer (its status record) are handed (see the module's list)."""

    membership: Membership
    node_rank: int

    @property
    def generation(self) -> int:
        return self.membership.generation

    @property
    def num_nodes(self) -> int:
        return len(self.membership.members)

    def addr_of(self, node_rank: int) -> str:
        return self.membership.members[node_rank].addr
