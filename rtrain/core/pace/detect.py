"""Which ranks are slow: a rank's compute per logical rank against its peers'. Pure.

In synchronous training every rank's step lasts as long as the slowest one's, so step
times cannot tell who is slow; the time a rank computes before it enters the
all-reduce can (the others wait in it for the slow one). Per window (core/pace/
figures.Windows) each rank's seconds of compute per logical data rank held is set
against the median of its peers' (every other rank's): a rank is slow in the window
when its figure exceeds that median by the factor `threshold` and by `spread` times
the peers' median absolute deviation (their own noise). A rank slow in `windows`
consecutive windows is a straggler, since the first of them; a straggler whose figure
stays below `clear_below` times its peers' for `windows` windows has recovered. All
ranks slowing down together (a slower phase of the training, a shared file system)
moves the peers' median with them: no rank stands out, nothing is found.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

from ..rendezvous.protocol import ProtocolError, json_object
from .figures import MAX_RANKS, Window


@dataclass(frozen=True)
class Rule:
    threshold: float = 1.3  # slower than the peers' median by more than this factor
    clear_below: float = 1.15  # a straggler recovers below this factor
    windows: int = 3  # consecutive windows to find one, and to clear one
    spread: float = 3.0  # and above the peers' median by this many of their MADs
    min_ranks: int = 2  # fewer ranks in a window: nothing to compare


@dataclass(frozen=True)
class Straggler:
    rank: int
    slower: float  # its compute per logical rank over its peers' median, this window
    since: float  # the wall clock of its first slow window in the streak that found it
    compute_s: float  # its seconds of compute per logical rank held, this window
    peers_s: float  # its peers' median of the same
    wait_s: float  # its seconds in the all-reduce per step
    peers_wait_s: float  # its peers' median of the same

    def speed(self) -> float:
        """Its speed relative to its peers' (1.0: theirs), for the balancing plan."""
        return 1.0 / max(self.slower, 1.0)


@dataclass(frozen=True)
class Verdict:
    found: tuple[Straggler, ...] = ()  # stragglers found in this window
    cleared: tuple[int, ...] = ()  # stragglers that recovered in this window
    current: Mapping[int, Straggler] = field(default_factory=dict)  # every straggler now


def compare(window: Window, rule: Rule) -> dict[int, tuple[float, bool]]:
    """rank -> (its compute per logical rank over its peers' median, whether it is slow
    in this window by the rule's factor and spread)."""
    out: dict[int, tuple[float, bool]] = {}
    ranks = sorted(window.compute)
    if len(ranks) < rule.min_ranks:
        return out
    for rank in ranks:
        peers = [window.compute[r] for r in ranks if r != rank]
        median = statistics.median(peers)
        mad = statistics.median(abs(p - median) for p in peers)
        mine = window.compute[rank]
        if median <= 0:
            out[rank] = (1.0, False)
            continue
        ratio = mine / median
        out[rank] = (ratio, ratio > rule.threshold and mine - median > rule.spread * mad)
    return out


class Detector:
    """Windows in, stragglers found and cleared out; no clock of its own (the windows
    carry their times)."""

    def __init__(self, rule: Rule | None = None) -> None:
        self.rule = rule or Rule()
        self._slow_streak: dict[int, tuple[int, float]] = {}  # rank -> (windows, since)
        self._fast_streak: dict[int, int] = {}  # straggler -> windows below clear_below
        self.current: dict[int, Straggler] = {}

    def observe(self, window: Window) -> Verdict:
        ratios = compare(window, self.rule)
        found, cleared = [], []
        for rank, (ratio, slow) in ratios.items():
            if rank in self.current:
                if self._recovers(rank, ratio):
                    cleared.append(rank)
                else:
                    since = self.current[rank].since
                    self.current[rank] = self._straggler(window, rank, ratio, since)
                continue
            streak, since = self._slow_streak.get(rank, (0, window.t))
            if not slow:
                self._slow_streak.pop(rank, None)
                continue
            streak, since = (streak + 1, since if streak else window.t)
            self._slow_streak[rank] = (streak, since)
            if streak >= self.rule.windows:
                self.current[rank] = self._straggler(window, rank, ratio, since)
                self._slow_streak.pop(rank, None)
                found.append(self.current[rank])
        for rank in [r for r in self.current if r not in ratios]:  # gone from the job
            cleared.append(rank)
            self._fast_streak.pop(rank, None)
        for rank in cleared:
            self.current.pop(rank, None)
        return Verdict(tuple(found), tuple(sorted(cleared)), dict(self.current))

    def _recovers(self, rank: int, ratio: float) -> bool:
        if ratio >= self.rule.clear_below:
            self._fast_streak.pop(rank, None)
            return False
        count = self._fast_streak.get(rank, 0) + 1
        self._fast_streak[rank] = count
        if count < self.rule.windows:
            return False
        self._fast_streak.pop(rank, None)
        return True

    def _straggler(self, window: Window, rank: int, ratio: float, since: float) -> Straggler:
        peers = [r for r in window.compute if r != rank]
        return Straggler(
            rank,
            round(ratio, 4),
            since,
            round(window.compute[rank], 6),
            round(_median([window.compute[r] for r in peers]), 6),
            round(window.wait.get(rank, 0.0), 6),
            round(_median([window.wait.get(r, 0.0) for r in peers]), 6),
        )


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def encode_verdict(current: Mapping[int, Straggler]) -> str:
    """Node 0's verdict for the store (r<g>/stragglers): every straggler now."""
    found = {str(rank): asdict(one) for rank, one in sorted(current.items())}
    return json.dumps({"v": 1, "stragglers": found}, separators=(",", ":"))


def decode_verdict(payload: bytes | str) -> dict[int, Straggler]:
    """The stragglers of a verdict; ProtocolError for anything rtrain did not write."""
    data = json_object(payload, "straggler verdict")
    found = data.get("stragglers")
    if data.get("v") != 1 or not isinstance(found, dict) or len(found) > MAX_RANKS:
        raise ProtocolError("straggler verdict: not a version-1 verdict")
    names = [f.name for f in fields(Straggler)]
    out = {}
    for key, value in found.items():
        if not isinstance(value, dict) or sorted(value) != sorted(names):
            raise ProtocolError(f"straggler verdict: rank {key!r}")
        if not all(_finite(value[n]) for n in names) or value["rank"] != _int(key):
            raise ProtocolError(f"straggler verdict: rank {key!r}")
        out[int(key)] = Straggler(int(value["rank"]), *(float(value[n]) for n in names[1:]))
    return out


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None
