"""A train-through generation as `rtrain status` and `rtrain report` show it: the kept
ranks training at reduced size, whose data shares they hold, the new ranks joining, and
since when. Written by the agents (agent/repair/through_watch.py) into their status
records and their `train_through` and `full_size` events. Pure; a note read from the
store is refused unless rtrain could have written it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_RANKS = 1 << 20


class ThroughError(ValueError):
    """A note rtrain did not write."""


@dataclass(frozen=True)
class ThroughNote:
    kept: tuple[int, ...]  # ranks training on (their processes kept)
    joining: tuple[int, ...]  # new ranks starting up, to join at a step boundary
    shares: dict[int, tuple[int, ...]]  # kept rank -> the logical data ranks it holds
    since: float  # wall clock: when the kept ranks went on at reduced size
    full: bool = False  # the new ranks joined: the job is at full size again

    def as_json(self) -> dict[str, Any]:
        return {
            "kept": list(self.kept),
            "joining": list(self.joining),
            "shares": {str(rank): list(held) for rank, held in self.shares.items()},
            "since": round(self.since, 3),
            "full": self.full,
        }

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> ThroughNote:
        kept, joining = _ranks(data.get("kept"), "kept"), _ranks(data.get("joining"), "joining")
        since, full, shares = data.get("since"), data.get("full", False), data.get("shares")
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise ThroughError("since must be a number")
        if not math.isfinite(since) or not isinstance(full, bool):
            raise ThroughError("since must be finite and full a boolean")
        if not isinstance(shares, dict) or len(shares) > MAX_RANKS:
            raise ThroughError("shares must be an object")
        held: dict[int, tuple[int, ...]] = {}
        for key, value in shares.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise ThroughError(f"shares: {key!r} is not a rank")
            held[int(key)] = _ranks(value, "shares")
        return cls(kept, joining, held, float(since), full)

    def describe(self, now: float) -> str:
        """'training at 3 of 4 ranks, rank 1's share on rank 2, rank 1 joining: warming up
        12 s'; once full: 'full size again (4 ranks)'."""
        world = len(self.kept) + len(self.joining)
        if self.full:
            return f"full size again ({world} ranks)"
        moved = [
            f"rank {logical}'s share on rank {holder}"
            for holder, held in sorted(self.shares.items())
            for logical in held
            if logical != holder
        ]
        joining = ", ".join(str(r) for r in self.joining)
        plural = "s" if len(self.joining) > 1 else ""
        waited = max(now - self.since, 0.0)
        return ", ".join(
            [
                f"training at {len(self.kept)} of {world} ranks",
                *moved,
                f"rank{plural} {joining} joining: warming up {waited:.0f} s",
            ]
        )


def _ranks(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise ThroughError(f"{name} must be a list of ranks")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
        raise ThroughError(f"{name} must hold ranks (non-negative integers)")
    return tuple(value)


def merged(notes: Sequence[ThroughNote]) -> ThroughNote | None:
    """The job's note from its nodes' (each node's own kept ranks' view): the union of
    the kept and joining ranks and of the shares, the earliest start, full once all say
    so."""
    if not notes:
        return None
    kept = sorted({r for n in notes for r in n.kept})
    joining = sorted({r for n in notes for r in n.joining} - set(kept))
    shares: dict[int, tuple[int, ...]] = {}
    for note in notes:
        shares.update(note.shares)
    return ThroughNote(
        tuple(kept),
        tuple(joining),
        shares,
        min(n.since for n in notes),
        all(n.full for n in notes),
    )
