"""Benchmark rtrain launch against torchrun, side by side on the same script and machine.

(a) start: launcher process start -> the first collective of the first generation.
(b) restart: a worker crashes (exit 3 after its first steps) -> the first collective of
    the next generation, with --max-restarts=1.

Each figure is the median of --runs runs, interleaved (torchrun, rtrain, torchrun, ...)
so that both see the same machine state. A run that does not finish within --timeout
counts as hung and is reported, not averaged. Results go to docs/benchmarks.md.

    python scripts/bench_launch.py --runs 5 --timeout 30
    python scripts/bench_launch.py --events-cost --runs 5

--events-cost measures rtrain against itself instead: structured events and a
--metrics-file on (the default events, plus the metrics file) against --events=off
and no metrics file, interleaved the same way, in a section of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PROBE = str(ROOT / "tests" / "scripts" / "train_probe.py")
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "rtrain": [sys.executable, "-m", "rtrain.cli.main", "launch"],
}
# --events-cost: the same launch with events and metrics on, and with both off.
OBSERVE = {
    "observed": [*LAUNCHERS["rtrain"], "--events=on"],
    "quiet": [*LAUNCHERS["rtrain"], "--events=off"],
}
FLAGS = ["--standalone", "--nproc-per-node=2"]
MARK_BEGIN, MARK_END = "<!-- bench_launch:begin -->", "<!-- bench_launch:end -->"
EVENTS_BEGIN, EVENTS_END = "<!-- bench_launch_events:begin -->", "<!-- bench_launch_events:end -->"


def _records(out: Path) -> dict[tuple[int, int], dict]:
    found = {}
    for path in out.glob("gen*_rank*.json"):
        gen, rank = path.stem.removeprefix("gen").split("_rank")
        found[(int(gen), int(rank))] = json.loads(path.read_text())
    return found


def _run(launcher: str, scenario: str, timeout: float) -> float | str:
    """Seconds for the scenario, or "hung" / "failed"."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "PROBE_"))}
        env.update(PROBE_OUT=str(out), PROBE_STEPS="3", OMP_NUM_THREADS="1")
        cmd = [*{**LAUNCHERS, **OBSERVE}[launcher], *FLAGS]
        if launcher == "observed":
            cmd += [f"--log-dir={out}/logs", f"--metrics-file={out}/node.prom"]
        if scenario == "restart":
            env["PROBE_FAULT"] = "rank=1,step=1,gen=0,action=exit"
            cmd.append("--max-restarts=1")
        started = time.time()
        try:
            proc = subprocess.run(
                [*cmd, PROBE], env=env, capture_output=True, timeout=timeout, cwd=ROOT
            )
        except subprocess.TimeoutExpired:
            return "hung"
        if proc.returncode != 0:
            return "failed"
        found = _records(out)
        if scenario == "start":
            return found[(0, 0)]["t_first_collective"] - started
        first_after = min(found[(1, r)]["t_first_collective"] for r in (0, 1))
        return first_after - found[(0, 1)]["t_fault"]


def measure(
    runs: int, timeout: float, launchers: Sequence[str] = tuple(LAUNCHERS)
) -> dict[tuple[str, str], list[float | str]]:
    results: dict[tuple[str, str], list[float | str]] = {}
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("benchmark runs", total=runs * 2 * len(launchers))
        for scenario in ("start", "restart"):
            for _ in range(runs):
                for launcher in launchers:
                    value = _run(launcher, scenario, timeout)
                    results.setdefault((launcher, scenario), []).append(value)
                    progress.advance(task)
    return results


SCENARIO_LABELS = (
    ("start", "(a) start -> first collective"),
    ("restart", "(b) crash -> next generation's first collective"),
)


def summarize(results: dict[tuple[str, str], list[float | str]]) -> list[dict]:
    rows = []
    for scenario, label in SCENARIO_LABELS:
        medians = {}
        hung = {}
        for launcher in LAUNCHERS:
            outcomes = results[(launcher, scenario)]
            values = [v for v in outcomes if isinstance(v, float)]
            hung[launcher] = f"{outcomes.count('hung')} hung, {outcomes.count('failed')} failed"
            medians[launcher] = statistics.median(values) if values else None
        t, r = medians["torchrun"], medians["rtrain"]
        rows.append(
            {
                "label": label,
                "torchrun": t,
                "rtrain": r,
                "ratio": (r / t) if (t and r) else None,
                "speedup": (t / r) if (t and r) else None,
                "hung": hung,
            }
        )
    return rows


def _fmt(value: float | None, unit: str = "s") -> str:
    return "n/a" if value is None else f"{value:.3f} {unit}".strip()


def section_head(begin: str, title: str, command: str) -> list[str]:
    """A benchmark section's first lines: its marker, title and the command that made it;
    the machine line follows."""
    return [begin, f"## {title}", "", f"Command: `{command}`  "]


def render(rows: list[dict], runs: int, command: str) -> str:
    lines = [
        *section_head(MARK_BEGIN, "Launch and restart (`scripts/bench_launch.py`)", command),
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}, "
        f"gloo on the CPU, 2 workers, median of {runs} interleaved runs, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| scenario | torchrun | rtrain | rtrain/torchrun | speed-up "
        "| runs that did not finish (torchrun / rtrain) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {_fmt(row['torchrun'])} | {_fmt(row['rtrain'])} | "
            f"{_fmt(row['ratio'], '')} | {_fmt(row['speedup'], 'x')} | "
            f"{row['hung']['torchrun']} / {row['hung']['rtrain']} |"
        )
    lines += [
        "",
        "Targets (issue 2): (a) ratio <= 1.0; (b) speed-up >= 3x.",
        MARK_END,
    ]
    return "\n".join(lines)


def summarize_cost(results: dict[tuple[str, str], list[float | str]]) -> list[dict]:
    """Per scenario: the medians with events and metrics on and off, and their ratio."""
    rows = []
    for scenario, label in SCENARIO_LABELS:
        row: dict = {"label": label}
        for launcher in OBSERVE:
            values = [v for v in results[(launcher, scenario)] if isinstance(v, float)]
            row[launcher] = statistics.median(values) if values else None
            row[f"{launcher}_spread"] = (min(values), max(values)) if values else None
        on, off = row["observed"], row["quiet"]
        row["ratio"] = on / off if on and off else None
        rows.append(row)
    return rows


def render_cost(rows: list[dict], runs: int, command: str) -> str:
    title = "What events and metrics cost at launch and restart (`scripts/bench_launch.py`)"
    lines = [
        *section_head(EVENTS_BEGIN, title, command),
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}; "
        f"the scenarios above, rtrain only: `--events=on --metrics-file=...` against "
        f"`--events=off`, median (min-max) of {runs} interleaved runs, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| scenario | events + metrics on | both off | on / off |",
        "|---|---|---|---|",
    ]
    for row in rows:
        cells = []
        for launcher in OBSERVE:
            spread = row[f"{launcher}_spread"]
            extra = f" ({spread[0]:.3f}-{spread[1]:.3f})" if spread else ""
            cells.append(_fmt(row[launcher]) + extra)
        lines.append(f"| {row['label']} | {cells[0]} | {cells[1]} | {_fmt(row['ratio'], '')} |")
    lines += ["", "Target (issue 18): on / off within the runs' own spread.", EVENTS_END]
    return "\n".join(lines)


def write_doc(section: str, path: Path, begin: str = MARK_BEGIN, end: str = MARK_END) -> None:
    """Replace the section between the begin/end markers (or append it)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--events-cost", action="store_true", help="events on vs off")
    args = parser.parse_args()
    if args.events_cost:
        rows = summarize_cost(measure(args.runs, args.timeout, tuple(OBSERVE)))
        command = f"python scripts/bench_launch.py --events-cost --runs {args.runs}"
        section = render_cost(rows, args.runs, command)
        print(section)
        write_doc(section, Path(args.doc), EVENTS_BEGIN, EVENTS_END)
        return
    rows = summarize(measure(args.runs, args.timeout))
    table = Table(title="rtrain vs torchrun")
    for column in ("scenario", "torchrun", "rtrain", "rtrain/torchrun", "speed-up"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["label"],
            _fmt(row["torchrun"]),
            _fmt(row["rtrain"]),
            _fmt(row["ratio"], ""),
            _fmt(row["speedup"], "x"),
        )
    Console().print(table)
    command = f"python scripts/bench_launch.py --runs {args.runs} --timeout {args.timeout:g}"
    write_doc(render(rows, args.runs, command), Path(args.doc))


if __name__ == "__main__":
    main()
