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
)


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
