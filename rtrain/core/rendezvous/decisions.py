"""What an agent does next: its decisions as pure functions of what happened.

The agent (agent/agent.py) observes, calls these, and performs the action; nothing
here reads a store, a clock or a process. In the style of torch.distributed.elastic's
rendezvous, `decide(state) -> action`, so every branch is a unit test
(tests/unit/core/test_decisions.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum

from .failures import FailureKind, FailureRecord, is_collective_victim, root_cause_first


class Outcome(Enum):
    """How a generation ended on this node."""

    SUCCEEDED = "succeeded"  # every local worker exited 0
    LOCAL_FAILURE = "local failure"  # a local worker failed (or hung and was killed)
    MEMBERSHIP_CHANGE = "membership change"  # fenced, a peer lost, or a node waits to join
    GPU_FAULT = "GPU fault"  # the health guard found a fault on this node's GPUs
    SLOW_NODE = "slow node"  # a rank here stayed a straggler (--replace-stragglers-after)


class Next(Enum):
    """What the agent does after a generation ends."""

    FINISH = "wait at the exit barrier; succeed, or rejoin if the job moved on"
    LEAVE = "leave the job: a GPU fault excludes this node"
    REJOIN = "stop the workers, record any failures of theirs, rejoin the next round"
    RECOVER = "stop the workers, record the failure, restart unless the budget says no"


@dataclass(frozen=True)
class GenerationEnd:
    outcome: Outcome
    fault_excludes_node: bool = False  # a GPU fault whose action takes the node out


def after_generation(end: GenerationEnd) -> Next:
    if end.outcome is Outcome.SUCCEEDED:
        return Next.FINISH
    if end.fault_excludes_node:
        return Next.LEAVE
    if end.outcome is Outcome.MEMBERSHIP_CHANGE:
        return Next.REJOIN
    return Next.RECOVER


class Charge(Enum):
    """What a local failure costs the job's --max-restarts budget."""

    NOT_FIRST = "another node reported first: restart, not charged"
    CHARGE = "restart, charged to the budget"
    CHECK_PEERS = "the budget is spent: first see whether a peer node was lost"
    PEER_LOST = "a peer node was lost: restart, not charged"
    GIVE_UP = "the budget is spent and nothing explains the failure: end the job"


def charge_for_failure(first_reporter: bool, exhausted: bool, peer_lost: bool | None) -> Charge:
    """first_reporter: this node claimed the generation's restart; exhausted: the budget
    is spent; peer_lost: whether a peer was found lost (None: not looked yet, asked
    for with CHECK_PEERS only when it matters)."""
    if not first_reporter:
        return Charge.NOT_FIRST
    if not exhausted:
        return Charge.CHARGE
    if peer_lost is None:
        return Charge.CHECK_PEERS
    return Charge.PEER_LOST if peer_lost else Charge.GIVE_UP


def failure_to_charge(
    records: Sequence[FailureRecord], lost: Collection[int]
) -> FailureRecord | None:
    """The failure a generation's next round charges to its node (--max-node-failures),
    if any; records: the generation's failure records, lost: its nodes declared lost.

    A lost node was charged once, by whoever declared it lost; its loss explains every
    other failure of the generation (the survivors' collectives broke under it), so
    nothing more is charged: no survivor, nor the lost node again for records of its
    own (a node stopped, declared lost, then back to record its workers). Without a
    loss, the root cause; but a victim (a rank whose collective broke under a peer)
    never: when the earliest failure is one, whoever broke the collective left no
    record, and nobody is charged. A worker rtrain stopped is never charged either."""
    if lost or any(r.kind is FailureKind.LOST_NODE for r in records):
        return None
    ranked = root_cause_first([r for r in records if r.kind is not FailureKind.STOPPED])
    if not ranked or is_collective_victim(ranked[0]):
        return None
    return ranked[0]
