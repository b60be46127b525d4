"""Which shard requests a node's shard server serves: a pure decision per request.

The job secret proves a peer is part of the job; it does not say which part. A
replica is accepted only where placement would send it (from a node whose ring
successors include this one), only for the generation now running, and only for a
step that is plausible: not older than a step its sender has confirmed, and not beyond
the newest step this node's own workers have reached by more than the snapshot
interval they keep. A shard is handed out only to a member of the current generation,
and a connection from anywhere else is refused before its handshake. So a stolen
secret alone, used from anywhere else, gets nothing, and a replica for a far-future
step (which a restore plan would prefer) is refused.

Confirmed: a sender replicates each rank's steps in order, so a replica kept here is
confirmed once a newer one of the same rank superseded it; the newest one kept is not
yet. A put older than the newest kept but not older than the newest confirmed is the
sender's own stream going on: it is accepted, and the unconfirmed newer replica (a
forged one, or a confused peer's) is dropped (superseded_by), where refusing it made
every genuine put of the rank "older" and stalled its worker until it was killed.
Every refusal names its reason, so that each reason gets its own log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# Ranks of one data-parallel job snapshot at the same steps, a step or so apart.
MIN_LEAD = 2


@dataclass
class StepCeiling:
    """The newest step this node's own workers reached, and how far apart they snapshot."""

    newest: int | None = None
    gap: int = 0
    # No limit while this node's workers are all new ones warming up in a train-through
    # generation: the kept ranks elsewhere go on stepping, and nothing of this node's
    # says how far (their replicas would be refused and their snapshots wait). Until
    # one of its own workers commits a step past the newest known then (the restored
    # shards put in their slots are seen again as the slots are scanned: not theirs).
    lifted: bool = False

    def lift(self) -> None:
        self.lifted = True

    def observe(self, step: int) -> None:
        if self.newest is None or step > self.newest:
            self.lifted = False
        if self.newest is not None and step > self.newest:
            self.gap = max(self.gap, step - self.newest)
        if self.newest is None or step > self.newest:
            self.newest = step

    @property
    def limit(self) -> int | None:
        """The newest step a peer's replica may have; None: nothing known yet (or
        lifted)."""
        if self.newest is None or self.lifted:
            return None
        return self.newest + max(2 * self.gap, MIN_LEAD)


class Reason(str, Enum):
    """Why a request was refused: the shard server logs each reason apart."""

    STRANGER = "stranger"  # a connection from no member's address
    GENERATION = "generation"
    SENDER = "sender"
    OLDER = "older"
    BEYOND = "beyond"
    READER = "reader"


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return self.detail


def confirmed_step(kept: list[int]) -> int | None:
    """The newest of the steps kept for a rank that a newer one superseded (its sender
    went past it), or None: the newest one kept is not confirmed yet."""
    older = sorted(set(kept))[:-1]
    return older[-1] if older else None


def superseded_by(step: int, kept: list[int]) -> list[int]:
    """The kept steps an accepted replica of `step` drops: the newer ones, which its
    sender, now at `step`, never confirmed."""
    return sorted(s for s in kept if s > step)


@dataclass
class Admission:
    generation: int | None = None
    senders: frozenset[str] = frozenset()  # addresses of the nodes that replicate here
    readers: frozenset[str] = frozenset()  # addresses of the current members
    ceiling: StepCeiling = field(default_factory=StepCeiling)

    def refuse_connection(self, source: str) -> Refusal | None:
        """Whether a connection from `source` is refused before its handshake: only the
        current members' addresses may use a thread and a handshake slot."""
        if source not in self.readers:
            return Refusal(
                Reason.STRANGER, f"{source} is not a member of generation {self.generation}"
            )
        return None

    def refuse_put(
        self, sender: str, generation: int, step: int, kept: list[int]
    ) -> Refusal | None:
        """Why a replica of (generation, step) from `sender` is refused, or None.
        kept: the steps already held for that rank."""
        if self.generation is None or generation != self.generation:
            return Refusal(
                Reason.GENERATION,
                f"generation {generation} is not the current one ({self.generation})",
            )
        if sender not in self.senders:
            return Refusal(Reason.SENDER, f"{sender} does not replicate to this node")
        confirmed = confirmed_step(kept)
        if confirmed is not None and step < confirmed:
            return Refusal(
                Reason.OLDER,
                f"step {step} is older than the replica kept (step {confirmed}, "
                "which its sender went past)",
            )
        limit = self.ceiling.limit
        if limit is not None and step > limit:
            return Refusal(
                Reason.BEYOND,
                f"step {step} is beyond any step this job has reached (at most {limit})",
            )
        return None

    def refuse_get(self, reader: str) -> Refusal | None:
        if reader not in self.readers:
            return Refusal(Reason.READER, f"{reader} is not a member of the current generation")
        return None
