"""Place: this node's place in one generation, its membership and its node rank: what
the parts that do not run the generation (the job's end, the observer, the fault
policy) are given, instead of the agent's Generation."""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import Membership


@dataclass(frozen=True)
class Place:
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
