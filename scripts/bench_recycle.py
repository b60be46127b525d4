"""ReCycle on running processes against the simulator: iteration times of
torch.distributed.pipelining jobs on CPU gloo, ops of fixed duration
(scripts/bench_recycle_worker.py), each beside the planner's simulation of the same
profile.

For each job (DP=2 x PP=2 and DP=3 x PP=2): fault-free, torch's Schedule1F1B and
rtrain's ScheduleReCycle on the fault-free plan; with failures, ScheduleReCycle on
ReCycle's plan and on the drop-the-replicas plan (the baseline: a replica that lost a
worker is dropped and its micro-batches spread over the others). Every run is started
by torchrun on this machine, one process per surviving worker.

    python scripts/bench_recycle.py

Writes docs/benchmarks.md (between its bench_recycle markers), docs/bench_recycle.json
and docs/recycle-measured.png (measured and simulated timelines, one above the other).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import write_doc

from rtrain.cli.render.timeline import write_timeline_png
from rtrain.core.layout.recycle import failure_plan
from rtrain.core.planner.job import PipelineJob
from rtrain.core.planner.report import TimelineRow, timeline_rows
from rtrain.core.planner.scheduler import plan
from rtrain.core.planner.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "scripts" / "bench_recycle_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
MARK_BEGIN, MARK_END = "<!-- bench_recycle:begin -->", "<!-- bench_recycle:end -->"
# Seconds per op: long against Python's and gloo's per-op cost (about a millisecond
# here), short enough for a run of 12 iterations to take seconds.
PROFILE = {
    "forward": 0.04,
    "backward_input": 0.04,
    "backward_weight": 0.04,
    "optimizer": 0.02,
    "transfer": 0.002,
}
MICROBATCHES = 4
# (DP, PP, failed workers as (replica, stage))
JOBS: list[tuple[int, int, list[tuple[int, int]]]] = [
    (2, 2, []),
    (2, 2, [(1, 1)]),
    (3, 2, []),
    (3, 2, [(1, 1)]),
    (3, 2, [(1, 0), (2, 1)]),
]
PICTURE_JOB = (3, 2, [(1, 0), (2, 1)])
TIMELINE_STEPS = (6, 7)
console = Console()


def simulated(job: PipelineJob, failed: list[tuple[int, int]], schedule: str) -> float:
    if schedule == "torch-1f1b":
        return simulate(plan(job, (), "1f1b")).iteration_time
    return float(failure_plan(job, failed, schedule)["iteration_time"])


def workers_of(job: PipelineJob, failed: list[tuple[int, int]], schedule: str) -> int:
    if schedule == "torch-1f1b":
        return job.dp * job.pp
    return len(failure_plan(job, failed, schedule)["positions"])


def measure(
    job: PipelineJob, failed: list[tuple[int, int]], schedule: str, iterations: int, timeline: bool
) -> tuple[float, list[dict[str, Any]]]:
    """(seconds per iteration, every rank's record): the steady period from the end of
    the second iteration to the end of the last, the slowest worker's."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            *TORCHRUN,
            f"--nproc-per-node={workers_of(job, failed, schedule)}",
            WORKER,
            *("--dp", str(job.dp), "--pp", str(job.pp), "--microbatches", str(job.microbatches)),
            *("--schedule", schedule, "--profile", json.dumps(PROFILE), "--out", out),
            *("--iterations", str(iterations)),
            *[f"--fail={r}:{s}" for r, s in failed],
        ]
        if timeline:
            command += ["--timeline-steps", *map(str, TIMELINE_STEPS)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"bench_recycle: {schedule} run failed:\n{done.stderr[-3000:]}")
        records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    periods = [(r["ends"][-1] - r["ends"][1]) / (len(r["ends"]) - 2) for r in records]
    return max(periods), records


def measured_rows(
    job: PipelineJob, failed: list[tuple[int, int]], records: list[dict]
) -> list[TimelineRow]:
    """The recorded ops of TIMELINE_STEPS as timeline rows, from the first one's start;
    an op is drawn from when its input had arrived (waiting is idle, as simulated)."""
    origin = min(op[4] for r in records for op in r["ops"])
    by_position = {(r["replica"], r["stage"]): r for r in records}
    rows = []
    for stage in range(job.pp):
        for replica in range(job.dp):
            record = by_position.get((replica, stage))
            blocks = []
            for kind, _, r, m, start, end in (record or {}).get("ops", []):
                what = kind if kind == "OPT" else f"{kind} r{r}m{m}"
                blocks.append((kind, start - origin, end - origin, what))
            rows.append(TimelineRow(f"r{replica} s{stage}", (replica, stage) in failed, blocks))
    return rows


def run(iterations: int) -> tuple[list[dict[str, Any]], list[TimelineRow] | None]:
    results: list[dict[str, Any]] = []
    picture: list[TimelineRow] | None = None
    runs = [(dp, pp, failed, s) for dp, pp, failed in JOBS for s in schedules(failed)]
    for index, (dp, pp, failed, schedule) in enumerate(runs, 1):
        job = PipelineJob.from_profile(PROFILE, dp, pp, MICROBATCHES)
        wanted = (dp, pp, failed) == PICTURE_JOB and schedule == "recycle"
        seconds, records = measure(job, failed, schedule, iterations, wanted)
        if wanted:
            picture = measured_rows(job, failed, records)
        sim = simulated(job, failed, schedule)
        results.append(
            {
                "dp": dp,
                "pp": pp,
                "failed": [list(w) for w in failed],
                "schedule": schedule,
                "workers": len(records),
                "measured_s": round(seconds, 4),
                "simulated_s": round(sim, 4),
            }
        )
        console.print(
            f"[{index}/{len(runs)}] DP={dp} x PP={pp}, failed {failed or 'none'}, {schedule}: "
            f"{seconds:.3f} s per iteration (simulated {sim:.3f} s)"
        )
    return results, picture


def schedules(failed: list[tuple[int, int]]) -> list[str]:
    return ["recycle", "drop"] if failed else ["torch-1f1b", "recycle"]


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        partner = next(
            (o for o in results if (o["dp"], o["failed"]) == (r["dp"], r["failed"]) and o is not r),
            None,
        )
        versus = "-"
        if partner is not None and r["schedule"] == "recycle" and partner["schedule"] == "drop":
            versus = (
                f"{partner['measured_s'] / r['measured_s']:.2f}x "
                f"(sim {partner['simulated_s'] / r['simulated_s']:.2f}x)"
            )
        if (
            partner is not None
            and r["schedule"] == "recycle"
            and partner["schedule"] == "torch-1f1b"
        ):
            versus = f"{r['measured_s'] / partner['measured_s'] - 1:+.1%} vs torch 1F1B"
        failed = ", ".join(f"{a}:{b}" for a, b in r["failed"]) or "none"
        rows.append(
            [
                f"{r['dp']} x {r['pp']}",
                failed,
                r["schedule"],
                str(r["workers"]),
                f"{r['measured_s']:.3f}",
                f"{r['simulated_s']:.3f}",
                f"{r['measured_s'] / r['simulated_s'] - 1:+.1%}",
                versus,
            ]
        )
    return rows


def draw(path: Path, measured: list[TimelineRow]) -> None:
    """The picture job's simulated timeline above its measured one, on one time axis."""
    dp, pp, failed = PICTURE_JOB
    job = PipelineJob.from_profile(PROFILE, dp, pp, MICROBATCHES)
    chosen = plan(job, failed, "recycle")
    alive = dp * pp - len(failed)
    panels = [
        (
            f"simulated: ReCycle plan, DP={dp} x PP={pp}, failed {failed}, two iterations",
            timeline_rows(chosen, simulate(chosen)),
        ),
        (
            f"measured: ScheduleReCycle on {alive} gloo processes, iterations {TIMELINE_STEPS}",
            measured,
        ),
    ]
    write_timeline_png(path, panels, "seconds")


def section(rows: list[list[str]], iterations: int) -> str:
    machine = f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"
    profile = (
        f"F, B, W {PROFILE['forward']} s each per stage, optimizer {PROFILE['optimizer']} s, "
        f"transfer {PROFILE['transfer']} s (simulated; measured runs send real activations "
        "over gloo on loopback)"
    )
    lines = [
        MARK_BEGIN,
        "",
        "Command: `python scripts/bench_recycle.py`  ",
        f"Machine: 2 cores, {machine}, {time.strftime('%Y-%m-%d')}. Profile: {profile}; "
        f"{MICROBATCHES} micro-batches per replica; {iterations} iterations per run, timed "
        "from the end of the second to the end of the last (the slowest worker's).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "![measured and simulated ReCycle timelines](recycle-measured.png)",
        MARK_END,
    ]
    return "\n".join(lines)


COLUMNS = (
    "DP x PP",
    "failed",
    "schedule",
    "workers",
    "measured (s/iteration)",
    "simulated (s/iteration)",
    "measured vs simulated",
    "ReCycle throughput vs drop / overhead",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    results, measured = run(args.iterations)
    rows = table_rows(results)
    table = Table(title="ReCycle on running processes against the simulator")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)

    picture = ROOT / "docs" / "recycle-measured.png"
    if measured is not None:
        draw(picture, measured)
    summary = {"profile": PROFILE, "microbatches": MICROBATCHES, "results": results}
    (ROOT / "docs" / "bench_recycle.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_doc(section(rows, args.iterations), Path(args.doc), MARK_BEGIN, MARK_END)
    console.print(f"wrote {args.doc}, {picture}")


if __name__ == "__main__":
    main()
