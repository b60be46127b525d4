"""Which shard requests a node's shard server serves: a pure decision per request.

The job secret proves a peer is part of the job; it does not say which part. A
replica is accepted only where placement would send it (from a node whose ring
successors include this one), only for the generation now running, and only for a
step that is plausible: not older than the replica already kept for that rank, and
not beyond the newest step this node's own workers have reached by more than the
snapshot interval they keep. A shard is handed out only to a member of the current
generation. So a stolen secret alone, used from anywhere else, gets nothing, and a
replica for a far-future step (which a restore plan would prefer) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Ranks of one data-parallel job snapshot at the same steps, a step or so apart.
MIN_LEAD = 2


@dataclass
class StepCeiling:
    """The newest step this node's own workers reached, and how far apart they snapshot."""

    newest: int | None = None
    gap: int = 0

    def observe(self, step: int) -> None:
        if self.newest is not None and step > self.newest:
            self.gap = max(self.gap, step - self.newest)
        if self.newest is None or step > self.newest:
            self.newest = step

    @property
    def limit(self) -> int | None:
        """The newest step a peer's replica may have; None: nothing known yet."""
        if self.newest is None:
            return None
        return self.newest + max(2 * self.gap, MIN_LEAD)


@dataclass
class Admission:
    generation: int | None = None
    senders: frozenset[str] = frozenset()  # addresses of the nodes that replicate here
    readers: frozenset[str] = frozenset()  # addresses of the current members
    ceiling: StepCeiling = field(default_factory=StepCeiling)

    def refuse_put(self, sender: str, generation: int, step: int, kept: list[int]) -> str | None:
        """Why a replica of (generation, step) from `sender` is refused, or None.
        kept: the steps already held for that rank."""
        if self.generation is None or generation != self.generation:
            return f"generation {generation} is not the current one ({self.generation})"
        if sender not in self.senders:
            return f"{sender} does not replicate to this node"
        if kept and step < max(kept):
            return f"step {step} is older than the replica kept (step {max(kept)})"
        limit = self.ceiling.limit
        if limit is not None and step > limit:
            return f"step {step} is beyond any step this job has reached (at most {limit})"
        return None

    def refuse_get(self, reader: str) -> str | None:
        if reader not in self.readers:
            return f"{reader} is not a member of the current generation"
        return None
