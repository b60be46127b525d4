"""Benchmark the ReCycle planner on GPT-3-like pipelines.

For PP=8 (96 layers, 12 per stage, hidden 12288, sequence 2048, micro-batch 1, at
312 TFLOP/s: GPT-3 175B on A100s), DP 4..16, 8..32 micro-batches and 0..4 failed
workers (spread over replicas and stages), simulated over two iterations:
  ReCycle / fault-free    iteration-time ratio (target with one failure at DP=8: <= 1.10)
  drop / fault-free       the same when the replicas that lost a worker are dropped
  ReCycle vs drop         throughput ratio (target at DP=8, one failure: >= 1.3)
  planning time           the heuristic, and for DP=64, PP=16, 32 micro-batches and 3
                          failures (target: under 1 s)
and writes one timeline picture (docs/recycle-timeline.svg). Results go to
docs/benchmarks.md.

    python scripts/bench_planner.py
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import write_doc

from rtrain.core.planner.job import PipelineJob
from rtrain.core.planner.plan import NoSurvivor
from rtrain.core.planner.report import timeline_svg
from rtrain.core.planner.scheduler import plan
from rtrain.core.planner.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench_planner:begin -->"
MARK_END = "<!-- bench_planner:end -->"
FAILURES = [(1, 2), (2, 5), (3, 3), (0, 6)]  # distinct replicas and stages
GPT3 = {"layers_per_stage": 12, "hidden": 12288, "seq_len": 2048, "microbatch_size": 1}


def gpt3(dp: int, pp: int, microbatches: int) -> PipelineJob:
    return PipelineJob.from_model(dp, pp, microbatches, flops=312e12, **GPT3)


def timed_plan(job: PipelineJob, failed: list, schedule: str, iterations: int = 2):
    started = time.perf_counter()
    p = plan(job, failed, schedule, iterations)
    return p, time.perf_counter() - started


def measure(progress: Progress) -> list[dict]:
    configs = [(dp, m, k) for dp in (4, 8, 16) for m in (8, 16, 32) for k in range(5)]
    task = progress.add_task("planner configurations", total=len(configs))
    rows = []
    for dp, m, k in configs:
        job = gpt3(dp, 8, m)
        failed = FAILURES[:k]
        free = simulate(plan(job, [], "1f1b")).iteration_time
        recycle, seconds = timed_plan(job, failed, "recycle")
        rc = simulate(recycle).iteration_time
        try:
            dr = simulate(plan(job, failed, "drop")).iteration_time if failed else free
        except NoSurvivor:  # every replica lost a worker: nothing left to drop to
            dr = float("inf")
        rows.append(
            {
                "dp": dp,
                "m": m,
                "k": k,
                "recycle": rc / free,
                "drop": dr / free,
                "vs_drop": dr / rc,
                "plan_s": seconds,
            }
        )
        progress.advance(task)
    return rows


def _ratio(value: float) -> str:
    return "none left" if value == float("inf") else f"{value:.3f}"


def _times(value: float) -> str:
    return "-" if value == float("inf") else f"{value:.2f}x"


def render(rows: list[dict], big: tuple[float, float], command: str) -> str:
    lines = [
        MARK_BEGIN,
        "## ReCycle planner (`scripts/bench_planner.py`)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}. GPT-3 175B-like stages "
        "(12 layers each, hidden 12288, sequence 2048, micro-batch 1, 312 TFLOP/s), PP=8; "
        "failed workers 1:2, 2:5, 3:3, 0:6 (replica:stage) in that order; two iterations "
        "simulated, iteration time = the second's.",
        "",
        "| DP | micro-batches | failures | ReCycle / fault-free | drop / fault-free "
        "| ReCycle throughput vs drop | planning |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dp']} | {r['m']} | {r['k']} | {r['recycle']:.3f} | {_ratio(r['drop'])} "
            f"| {_times(r['vs_drop'])} | {r['plan_s'] * 1e3:.0f} ms |"
        )
    seconds, ops = big
    lines += [
        "",
        f"Planning DP=64, PP=16, 32 micro-batches, 3 failures (one iteration, {ops} "
        f"operations): {seconds:.2f} s (target: under 1 s).",
        "",
        "![ReCycle timeline](recycle-timeline.svg)",
        MARK_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    with Progress(console=Console(stderr=True)) as progress:
        rows = measure(progress)
    big_job = gpt3(64, 16, 32)
    big_plan, big_seconds = timed_plan(big_job, [(1, 2), (5, 7), (9, 2)], "recycle", 1)
    ops = sum(len(order) for order in big_plan.orders.values())
    table = Table(title="ReCycle planner, PP=8 (GPT-3-like)")
    for column in ("DP", "M", "failures", "ReCycle/free", "drop/free", "vs drop", "plan"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            str(r["dp"]),
            str(r["m"]),
            str(r["k"]),
            f"{r['recycle']:.3f}",
            _ratio(r["drop"]),
            _times(r["vs_drop"]),
            f"{r['plan_s'] * 1e3:.0f} ms",
        )
    Console().print(table)
    Console().print(f"DP=64 PP=16 M=32, 3 failures: planned in {big_seconds:.2f} s ({ops} ops)")
    picture = gpt3(4, 4, 8)
    example = plan(picture, [(1, 2)], "recycle")
    title = "ReCycle, DP=4 PP=4, 8 micro-batches, worker 1:2 failed (GPT-3-like stages)"
    (ROOT / "docs" / "recycle-timeline.svg").write_text(
        timeline_svg(example, simulate(example), title)
    )
    write_doc(
        render(rows, (big_seconds, ops), "python scripts/bench_planner.py"),
        Path(args.doc),
        MARK_BEGIN,
        MARK_END,
    )


if __name__ == "__main__":
    main()
