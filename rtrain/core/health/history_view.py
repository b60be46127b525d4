"""The nodes' fault history as `rtrain health --fault-history` shows it: each host's
faults within the window and the newest entries (the history's rules:
core/rendezvous/fault_history.py). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..rendezvous.fault_history import FaultEntry, recent_faults
from .gpu_health import Verdict

UNKNOWN = Verdict.UNKNOWN  # the exit code of a history that cannot be read
NEWEST = 8  # entries shown


@dataclass(frozen=True)
class HistoryView:
    path: str
    window_s: float
    recent: dict[str, int]  # host -> faults within the window
    newest: tuple[FaultEntry, ...]  # the newest entries, newest last
    total: int

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "window_s": self.window_s,
            "recent": dict(sorted(self.recent.items())),
            "entries": [
                {"host": e.host, "kind": e.kind, "time": e.time, "run": e.run} for e in self.newest
            ],
            "total": self.total,
        }


def history_view(
    path: str, entries: Sequence[FaultEntry], window_s: float, now: float
) -> HistoryView:
    ordered = sorted(entries, key=lambda e: e.time)
    recent = recent_faults(ordered, window_s, now)
    return HistoryView(path, window_s, recent, tuple(ordered[-NEWEST:]), len(ordered))
