"""bench_clients' look at the first steps: where a client's steps/s goes, per launcher.

The clients that mark their steps (client_common.step_done) report each step's seconds,
their CPU seconds and page faults while training. From those, per launcher, medians over
the runs: the first FIRST steps' time, the rate after them, CPU per step (which the
machine's load barely moves, so a worker that does more work shows here), and the
machine's load average while the runs ran.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

FIRST = 10  # "the first steps": this many
STEP_COLUMNS = (
    "client",
    "launcher",
    "runs",
    f"first {FIRST} steps",
    f"steps/s after {FIRST}",
    "steps/s (all)",
    "CPU ms/step",
    "minor faults",
    "load avg (min-max)",
)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float], digits: int = 0, unit: str = "") -> str:
    """median [min-max]"""
    if not values:
        return "-"
    return (
        f"{statistics.median(values):.{digits}f}{unit} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def step_stats(result: dict[str, Any]) -> dict[str, float] | None:
    """One rank's result in figures; None for a client that does not mark its steps."""
    steps = result.get("step_s") or []
    if len(steps) <= FIRST:
        return None
    later = steps[FIRST:]
    return {
        "first_ms": 1000 * sum(steps[:FIRST]),
        "later_rate": len(later) / sum(later) if sum(later) > 0 else 0.0,
        "rate": float(result.get("steps_per_s") or 0.0),
        "cpu_ms_per_step": 1000 * float(result.get("train_cpu_s", 0.0)) / len(steps),
        "minor_faults": float(result.get("train_minor_faults", 0)),
    }


def step_rows(runs: dict[str, dict[str, list[tuple[dict[str, Any], float]]]]) -> list[list[str]]:
    """runs: client -> launcher -> [(rank 0's result, the load average at the run's end)]."""
    rows = []
    for client, by_launcher in runs.items():
        for launcher, done in by_launcher.items():
            stats = [s for s in (step_stats(r) for r, _ in done) if s is not None]
            if not stats:
                continue
            loads = [load for _, load in done]
            rows.append(
                [
                    client,
                    launcher,
                    str(len(stats)),
                    _spread([s["first_ms"] for s in stats], 0, " ms"),
                    _spread([s["later_rate"] for s in stats]),
                    _spread([s["rate"] for s in stats]),
                    _spread([s["cpu_ms_per_step"] for s in stats], 2),
                    _spread([s["minor_faults"] for s in stats]),
                    f"{min(loads):.1f}-{max(loads):.1f}",
                ]
            )
    return rows


def paired_ratios(rtrain: Sequence[float], torchrun: Sequence[float]) -> str:
    """Each alternating pair's rtrain/torchrun ratio: median [min-max] (a pair ran back to
    back, so the machine's load moved less within it than across the whole bench)."""
    ratios = [a / b for a, b in zip(rtrain, torchrun, strict=False) if b > 0]
    return _spread(ratios, 2) if ratios else "-"


def later_rate(result: dict[str, Any]) -> float | None:
    stats = step_stats(result)
    return None if stats is None else stats["later_rate"]


def median_or_none(values: Sequence[float | None]) -> float | None:
    return _median([v for v in values if v is not None])
