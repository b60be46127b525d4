"""Closing a round: which of its joiners are left out, and why; what a round that never
closed says. Pure: the agent reads the slots and the ledger (agent/rendezvous/
round_close.py) and acts on what these return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .protocol import MemberInfo


@dataclass(frozen=True)
class LeftOut:
    """A joiner a round's closer left out: who (its address, or its slot when that could
    not be read) and why."""

    who: str
    why: str

    def __str__(self) -> str:
        return f"{self.who} ({self.why})"


def leave_out(
    members: Sequence[MemberInfo], exclusions: Mapping[str, str]
) -> tuple[list[MemberInfo], list[LeftOut]]:
    """The members a round may close with, and the excluded ones (address -> why)."""
    kept = [m for m in members if m.addr not in exclusions]
    out = [LeftOut(m.addr, exclusions[m.addr]) for m in members if m.addr in exclusions]
    return kept, out


def round_timeout(
    target: int, joined: int, min_nodes: int, join_timeout: float, left_out: Sequence[LeftOut]
) -> str:
    """Why a round never closed: how many joined and, when some were left out, whom and
    why (joined counts them: enough joined, too few could be let in)."""
    text = (
        f"rendezvous timed out: {joined} of at least {min_nodes} nodes joined "
        f"generation {target} within join_timeout={join_timeout:g}s"
    )
    if left_out:
        kept = max(joined - len(left_out), 0)
        text += (
            f"; {kept} could close it, {len(left_out)} left out: "
            f"{'; '.join(str(o) for o in left_out)}"
        )
    return text
