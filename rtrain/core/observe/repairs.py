"""A repair in place as `rtrain report` and `rtrain status` show it: what each node's
`repair` event (core/observe/events.py) said, merged per generation. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

MAX_RANKS = 1 << 20  # a list longer than this is not rtrain's


class RepairError(ValueError):
    """A repair note that rtrain did not write."""


@dataclass(frozen=True)
class RepairNote:
    from_generation: int
    kept: tuple[int, ...]  # ranks whose processes were kept (their ranks then)
    restarted: tuple[int, ...]  # ranks started afresh from the pool
    fallback: tuple[int, ...]  # of those, asked to repair but stopped: no park in time
    seconds: float  # how long the parking took (the slowest node's)
    # this repair was the job's FALLBACK_AFTER-th failed one: no repair in place after it
    job_fallback: bool = False
    # of the ranks kept at the park, those that could not resume (a repair_lost event:
    # stopped or gone before the hand-over): replaced, so not in kept, in restarted
    lost: tuple[int, ...] = ()

    def lose(self, rank: int) -> RepairNote:
        """This note once `rank`, kept at the park, was lost before the hand-over."""
        if rank not in self.kept:
            return self
        return replace(
            self,
            kept=tuple(r for r in self.kept if r != rank),
            restarted=tuple(sorted({*self.restarted, rank})),
            lost=tuple(sorted({*self.lost, rank})),
        )

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "from_generation": self.from_generation,
            "kept": list(self.kept),
            "restarted": list(self.restarted),
            "fallback": list(self.fallback),
            "seconds": round(self.seconds, 3),
        }
        if self.job_fallback:
            found["job_fallback"] = True
        if self.lost:
            found["lost"] = list(self.lost)
        return found

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> RepairNote:
        generation, seconds = data.get("from_generation"), data.get("seconds")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise RepairError("from_generation must be a non-negative integer")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise RepairError("seconds must be a number")
        if not math.isfinite(seconds) or seconds < 0:
            raise RepairError("seconds must be finite and not negative")
        kept, restarted = (
            _ranks(data.get("kept"), "kept"),
            _ranks(data.get("restarted"), "restarted"),
        )
        fallback = _ranks(data.get("fallback"), "fallback")
        job_fallback = data.get("job_fallback", False)
        if not isinstance(job_fallback, bool):
            raise RepairError("job_fallback must be true or false")
        lost = _ranks(data.get("lost", []), "lost")
        note = cls(int(generation), kept, restarted, fallback, float(seconds), job_fallback)
        return replace(note, lost=lost) if lost else note

    def describe(self) -> str:
        """'kept ranks 0 2 3, restarted 1 (fallback 2), parked in 0.41 s'."""
        text = f"kept ranks {_listed(self.kept)}, restarted {_listed(self.restarted)}"
        if self.fallback:
            text += f" (fallback: {_listed(self.fallback)} did not park)"
        if self.lost:
            text += f" ({_listed(self.lost)} lost after parking: replaced)"
        text = f"{text}, parked in {self.seconds:.2f} s"
        if self.job_fallback:
            text += "; repair in place off for the job from here (too many failed)"
        return text


def merge(notes: Iterable[RepairNote]) -> dict[int, RepairNote]:
    """The job's repairs by the generation they repaired: every node's ranks together,
    the slowest node's parking time. A generation in which no node kept a process
    restarted every worker: no repair in place (unless it turned repair off)."""
    merged: dict[int, RepairNote] = {}
    for note in notes:
        was = merged.get(note.from_generation)
        if was is not None:
            lost = set(was.lost) | set(note.lost)
            note = RepairNote(
                note.from_generation,
                tuple(sorted((set(was.kept) | set(note.kept)) - lost)),
                tuple(sorted(set(was.restarted) | set(note.restarted) | lost)),
                tuple(sorted(set(was.fallback) | set(note.fallback))),
                max(was.seconds, note.seconds),
                was.job_fallback or note.job_fallback,
                tuple(sorted(lost)),
            )
        merged[note.from_generation] = note
    return {g: note for g, note in merged.items() if note.kept or note.job_fallback}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ranks(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise RepairError(f"{name} must be a list of ranks")
    if not all(_is_int(rank) and rank >= 0 for rank in value):
        raise RepairError(f"{name} must hold ranks (non-negative integers)")
    return tuple(sorted(value))


def _listed(ranks: tuple[int, ...]) -> str:
    return " ".join(str(rank) for rank in ranks) if ranks else "none"
