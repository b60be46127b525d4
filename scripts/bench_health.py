"""Benchmark GPU health checks: `rtrain health` wall time and the agent's sampling cost.

On a fake 8-GPU node (tests/scenarios/healthy_8gpu.json, NVML replaced at the pynvml
function level):
  rtrain health          wall time of the whole command, Python start-up included,
                         for the table and for --json (target: under 0.5 s), next to
                         the floor (python -c pass) and torchrun's own start-up
                         (torchrun --help) measured in the same run
  sampling               one GpuMonitor.check() (every check on every GPU) and one
                         poll() of the agent's loop, and what a sample costs per
                         --health-interval (10 s)

The fake answers in microseconds, so the sampling figures are rtrain's own cost; real
NVML adds its driver calls (scripts/gpu_check.sh measures those on a GPU machine).

    python scripts/bench_health.py --runs 10
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import write_doc

from rtrain.agent.health.fake_nvml import FakeNvml, load_scenario
from rtrain.agent.health.gpu_monitor import GpuMonitor
from rtrain.core.health.gpu_health import Thresholds

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "scenarios" / "healthy_8gpu.json"
MARK_BEGIN = "<!-- bench_health:begin -->"
MARK_END = "<!-- bench_health:end -->"
TARGET_S = 0.5
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
INTERVAL_S = 10.0


def wall(cmd: list[str], runs: int, progress: Progress, label: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RTRAIN"))}
    times = []
    task = progress.add_task(label, total=runs)
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=False, cwd=ROOT)
        times.append(time.perf_counter() - started)
        progress.advance(task)
    return times


def sampling(reps: int) -> dict[str, float]:
    nvml = FakeNvml(load_scenario(str(SCENARIO)))
    nvml.nvmlInit()
    monitor = GpuMonitor(nvml, Thresholds(), 8, INTERVAL_S)
    try:
        checks, polls = [], []
        for _ in range(reps):
            started = time.perf_counter()
            report = monitor.check()
            checks.append(time.perf_counter() - started)
            assert report.exit_code == 0 and report.found == 8
            started = time.perf_counter()
            monitor.poll()
            polls.append(time.perf_counter() - started)
    finally:
        monitor.close()
    return {"check": statistics.median(checks), "poll": statistics.median(polls)}


def render(rows: list[tuple[str, list[float]]], sample: dict[str, float], command: str) -> str:
    lines = [
        MARK_BEGIN,
        "## GPU health (`scripts/bench_health.py`)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}; a fake 8-GPU node "
        "(`tests/scenarios/healthy_8gpu.json`), NVML replaced at the pynvml function level.",
        "",
        "| command | median | best | vs target 0.5 s |",
        "|---|---|---|---|",
    ]
    for label, times in rows:
        median = statistics.median(times)
        lines.append(
            f"| {label} | {median * 1e3:.0f} ms | {min(times) * 1e3:.0f} ms "
            f"| {median / TARGET_S:.2f} |"
        )
    per_interval = sample["check"] / INTERVAL_S
    lines += [
        "",
        "The agent's sampling cost (rtrain's own; real NVML adds its driver calls):",
        "",
        "| what | median | share of one core at --health-interval 10 s |",
        "|---|---|---|",
        f"| every check on 8 GPUs (`GpuMonitor.check`, sampling thread) "
        f"| {sample['check'] * 1e3:.2f} ms | {per_interval * 100:.3f} % |",
        f"| one `poll()` of the agent's loop (XIDs and pending reports) "
        f"| {sample['poll'] * 1e6:.0f} us | - |",
        MARK_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    health = [sys.executable, "-m", "rtrain.cli.main", "health", "--fake-nvml", str(SCENARIO)]
    commands = [
        ("`rtrain health` (table)", health),
        ("`rtrain health --json`", [*health, "--json"]),
        ("floor: `python -c pass`", [sys.executable, "-c", "pass"]),
        (
            "torchrun's start-up: `torchrun --help`",
            [sys.executable, "-m", "torch.distributed.run", "--help"],
        ),
    ]
    with Progress(console=Console(stderr=True)) as progress:
        rows = [(label, wall(cmd, args.runs, progress, label)) for label, cmd in commands]
    sample = sampling(200)
    table = Table(title="rtrain health on a fake 8-GPU node")
    for column in ("command", "median", "vs target 0.5 s"):
        table.add_column(column)
    for label, times in rows:
        median = statistics.median(times)
        table.add_row(label, f"{median * 1e3:.0f} ms", f"{median / TARGET_S:.2f}")
    Console().print(table)
    Console().print(
        f"sampling 8 GPUs: {sample['check'] * 1e3:.2f} ms; poll: {sample['poll'] * 1e6:.0f} us"
    )
    write_doc(
        render(rows, sample, f"python scripts/bench_health.py --runs {args.runs}"),
        Path(args.doc),
        MARK_BEGIN,
        MARK_END,
    )


if __name__ == "__main__":
    main()
