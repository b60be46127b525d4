"""The ranks' pace figures as the agents share them on the rendezvous store, and the
windows the deciding agent cuts from them. Pure.

Each agent publishes its ranks' cumulative figures (core/contract/pace.Pace) under
r<g>/pace/<node> every PUBLISH_S; node 0's agent reads every node's record in one
multi_get and turns the growth since the last window into a Window: per rank, seconds
of compute per logical rank held and seconds waited in the all-reduce per step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..contract.pace import Pace
from ..rendezvous.protocol import ProtocolError, json_object

PACE_VERSION = 1
MAX_RANKS = 4096


def encode_node(t: float, figures: Mapping[int, Pace]) -> str:
    """A node's record: its wall clock and each local rank's cumulative figures."""
    ranks = {str(rank): pace.as_list() for rank, pace in sorted(figures.items())}
    return json.dumps({"v": PACE_VERSION, "t": round(t, 3), "ranks": ranks}, separators=(",", ":"))


def decode_node(payload: bytes | str) -> dict[int, Pace]:
    """The figures of a node's record; ProtocolError for anything rtrain did not write."""
    data = json_object(payload, "pace record")
    ranks = data.get("ranks")
    if data.get("v") != PACE_VERSION or not isinstance(ranks, dict) or len(ranks) > MAX_RANKS:
        raise ProtocolError("pace record: not a version-1 record of ranks")
    found = {}
    for key, value in ranks.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ProtocolError(f"pace record: rank {key!r}")
        if not isinstance(value, list) or len(value) != 4:
            raise ProtocolError(f"pace record: figures of rank {key}")
        if not all(_number(v) and v >= 0 for v in value):
            raise ProtocolError(f"pace record: figures of rank {key}")
        steps, logical, compute, wait = value
        found[int(key)] = Pace(int(steps), int(logical), float(compute), float(wait))
    return found


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Window:
    """What the ranks did between two readings: per rank, seconds of compute per
    logical rank held, seconds waited in the all-reduce per step, and the logical ranks
    it held per step."""

    t: float  # the wall clock at the window's end
    compute: Mapping[int, float]
    wait: Mapping[int, float]
    held: Mapping[int, float]


class Windows:
    """Cuts windows from successive readings of every rank's cumulative figures: one
    once every rank read grew by at least min_steps steps (a rank that did not, or a
    reset, such as a new process, waits for the next reading)."""

    def __init__(self, min_steps: int = 3) -> None:
        self.min_steps = min_steps
        self._base: dict[int, Pace] = {}

    def feed(self, t: float, figures: Mapping[int, Pace]) -> Window | None:
        for rank, pace in figures.items():
            base = self._base.get(rank)
            if base is None or pace.steps < base.steps:  # new, or its process restarted
                self._base[rank] = pace
        for rank in [r for r in self._base if r not in figures]:
            del self._base[rank]
        grown = {r: _minus(p, self._base[r]) for r, p in figures.items()}
        if len(grown) < 2 or any(g.steps < self.min_steps or g.logical < 1 for g in grown.values()):
            return None
        self._base = dict(figures)
        return Window(
            t,
            {r: g.compute_s / g.logical for r, g in grown.items()},
            {r: g.wait_s / g.steps for r, g in grown.items()},
            {r: g.logical / g.steps for r, g in grown.items()},
        )


def _minus(now: Pace, base: Pace) -> Pace:
    return Pace(
        now.steps - base.steps,
        now.logical - base.logical,
        max(now.compute_s - base.compute_s, 0.0),
        max(now.wait_s - base.wait_s, 0.0),
    )
