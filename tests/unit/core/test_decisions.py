"""The agent's decisions (core/rendezvous/decisions.py), every branch."""

from __future__ import annotations

import itertools

import pytest

from rtrain.core.rendezvous.decisions import (
    Charge,
    GenerationEnd,
    Next,
    Outcome,
    after_generation,
    charge_for_failure,
    failure_to_charge,
)
from rtrain.core.rendezvous.failures import FailureRecord


@pytest.mark.parametrize(
    ("outcome", "excludes", "expected"),
    [
        (Outcome.SUCCEEDED, False, Next.FINISH),
        # A GPU fault while the workers succeed does not keep them from finishing.
        (Outcome.SUCCEEDED, True, Next.FINISH),
        (Outcome.GPU_FAULT, True, Next.LEAVE),
        (Outcome.GPU_FAULT, False, Next.RECOVER),  # a reset: restart on this node
        (Outcome.LOCAL_FAILURE, False, Next.RECOVER),
        (Outcome.MEMBERSHIP_CHANGE, False, Next.REJOIN),
        (Outcome.MEMBERSHIP_CHANGE, True, Next.LEAVE),
    ],
)
def test_what_follows_a_generation(outcome: Outcome, excludes: bool, expected: Next) -> None:
    assert after_generation(GenerationEnd(outcome, excludes)) is expected


def test_every_outcome_has_a_next_step() -> None:
    for outcome, excludes in itertools.product(Outcome, (False, True)):
        assert isinstance(after_generation(GenerationEnd(outcome, excludes)), Next)


@pytest.mark.parametrize(
    ("first", "exhausted", "peer_lost", "expected"),
    [
        (False, False, None, Charge.NOT_FIRST),
        (False, True, None, Charge.NOT_FIRST),  # never asks peers for another's charge
        (True, False, None, Charge.CHARGE),
        (True, False, True, Charge.CHARGE),
        (True, True, None, Charge.CHECK_PEERS),
        (True, True, True, Charge.PEER_LOST),
        (True, True, False, Charge.GIVE_UP),
    ],
)
def test_what_a_failure_costs(
    first: bool, exhausted: bool, peer_lost: bool | None, expected: Charge
) -> None:
    assert charge_for_failure(first, exhausted, peer_lost) is expected


def _failure(
    node: int, when: float, kind: str = "exit", message: str = "", host: str = ""
) -> FailureRecord:
    return FailureRecord(
        kind=kind,
        generation=4,
        node_rank=node,
        host=host or f"10.0.0.{node}",
        time=when,
        rank=None if kind == "lost_node" else node,
        message=message,
    )


VICTIM = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"


@pytest.mark.parametrize(
    ("records", "lost", "charged"),
    [
        ([], [], None),  # nothing failed
        # the audit: node 2 SIGKILLed; the survivors' ranks failed first, all victims
        ([_failure(0, 1.0, message=VICTIM), _failure(1, 1.1, message=VICTIM)], [2], None),
        # ... and the loss's record is in (the declarer's): nobody more is charged
        (
            [_failure(0, 1.0, message=VICTIM), _failure(2, 3.0, "lost_node")],
            [],
            None,
        ),
        # a node stopped, declared lost, back to record a failure of its own: not twice
        ([_failure(2, 0.5, "hang"), _failure(0, 1.0, message=VICTIM)], [2], None),
        # no loss, only victims: whoever broke the collective left no record
        ([_failure(0, 2.0, message=VICTIM), _failure(1, 1.0, message=VICTIM)], [], None),
        # no loss: the root cause, not the earlier victim
        ([_failure(0, 1.0, message=VICTIM), _failure(1, 2.0, "signal")], [], 1),
        ([_failure(0, 3.0), _failure(1, 2.0, "hang")], [], 1),
        # a worker rtrain stopped is never the one charged
        ([_failure(0, 1.0, "stopped")], [], None),
        ([_failure(0, 1.0, "stopped"), _failure(1, 2.0)], [], 1),
    ],
)
def test_whom_a_generations_failure_is_charged_to(
    records: list[FailureRecord], lost: list[int], charged: int | None
) -> None:
    found = failure_to_charge(records, lost)
    assert (found.node_rank if found is not None else None) == charged
    # the order the records were read in does not matter
    again = failure_to_charge(list(reversed(records)), lost)
    assert again == found
