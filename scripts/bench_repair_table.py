"""bench_repair.py's tables: its runs' outcomes summarized per launcher, as a rich table
for the terminal and as markdown for docs/benchmarks.md."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table


def summarize(results: dict[str, list[Any]]) -> list[dict]:
    """One row per launcher: the median and range of its recoveries (Outcome's)."""
    rows = []
    for name, outcomes in results.items():
        times = sorted(o.recovery for o in outcomes if o.recovery is not None)
        statuses = [o.status for o in outcomes]
        steps = [o.step_s for o in outcomes if o.step_s is not None]
        rows.append(
            {
                "launcher": name,
                "median": statistics.median(times) if times else None,
                "range": (times[0], times[-1]) if times else None,
                "kept": sum(o.kept for o in outcomes if o.recovery is not None),
                "recovered": len(times),
                "runs": len(outcomes),
                "step_s": statistics.median(steps) if steps else None,
                "outcomes": ", ".join(f"{statuses.count(s)}x {s}" for s in dict.fromkeys(statuses)),
            }
        )
    return rows


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def markdown(rows: list[dict], state_mb: float, runs: int, load: str) -> str:
    restart = next((r["median"] for r in rows if r["launcher"] == "rtrain"), None)
    lines = [
        f"{runs} interleaved runs, {state_mb:g} MB of extra state per rank, 2 ranks, gloo; "
        f"load average at the start: {load}.",
        "",
        "| launcher | fault -> next completed step (median) | min-max | vs rtrain restart "
        "| runs recovered | survivor kept its process | step before the fault | outcomes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['median'] / restart:.2f}" if r["median"] and restart else "-"
        spread = f"{r['range'][0]:.2f}-{r['range'][1]:.2f} s" if r["range"] else "-"
        lines.append(
            f"| {r['launcher']} | {_s(r['median'])} | {spread} | {ratio} | "
            f"{r['recovered']} of {r['runs']} | {r['kept']} of {r['recovered']} | "
            f"{_s(r['step_s'])} | {r['outcomes']} |"
        )
    return "\n".join(lines)


def print_table(rows: list[dict], load: str) -> None:
    table = Table(title=f"fault -> the survivors' next completed step (load {load})")
    for column in ("launcher", "median", "min-max", "recovered", "kept", "step", "outcomes"):
        table.add_column(column)
    for r in rows:
        spread = f"{r['range'][0]:.2f}-{r['range'][1]:.2f}" if r["range"] else "-"
        table.add_row(
            r["launcher"], _s(r["median"]), spread, f"{r['recovered']}/{r['runs']}",
            str(r["kept"]), _s(r["step_s"]), r["outcomes"],
        )  # fmt: skip
    Console(width=140).print(table)
