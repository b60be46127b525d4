"""Slow ranks worked around (issue 49): throughput of a job with one rank slowed on
purpose, with rtrain's balancing against without it and against the job without the
slow rank; and what the detection costs a step.

Each run is `rtrain launch --standalone --nproc-per-node=N` of tests/scripts/
train_straggler.py with RTRAIN_MICRO_BATCHES=M: every rank sleeps --work-ms per logical
rank it holds (a GPU's compute, without loading this machine's CPUs) and rank N-1
sleeps --slow-ms more per logical rank (a slow GPU). Runs:

  unslowed     no slow rank (--stragglers=detect): the ceiling
  unmitigated  the slow rank, found but not worked around (--stragglers=detect)
  balanced     the slow rank, worked around (--stragglers=balance)

Throughput: steps a second over the whole run (rank 0's seconds from its first step
to its last: the detection's first seconds, before the plan, included) and over the
last half of the steps (the steady state). Every run must end with the same digest.
The detection's cost a step: the worker's bookkeeping (core/worker/pace.py: two clock
reads and one 40-byte mapped write) timed alone, against the unslowed run's step, and
the seconds each run spent inside rtrain.data_ranks() (the balancing's agreement, an
all-reduce every RTRAIN_BALANCE_EVERY steps).

    python scripts/bench_straggler.py [--nproc 4] [--micro 4] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "train_straggler.py"
RUNS = (
    ("unslowed", "detect", False),
    ("unmitigated", "detect", True),
    ("balanced", "balance", True),
)


def run(name: str, mode: str, slow: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / name
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "tests" / "scripts"),
        "PROBE_OUT": str(out),
        "PROBE_STEPS": str(args.steps),
        "PROBE_WORK_S": str(args.work_ms / 1000),
        "PROBE_SLOW_RANK": str(args.nproc - 1 if slow else -1),
        "PROBE_SLOW_S": str(args.slow_ms / 1000),
        "RTRAIN_MICRO_BATCHES": str(args.micro),
    }
    cmd = [sys.executable, "-m", "rtrain.cli.main", "launch", "--standalone"]
    cmd += [f"--nproc-per-node={args.nproc}", f"--stragglers={mode}"]
    cmd += [f"--log-dir={tmp / 'logs' / name}", str(SCRIPT)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp)
    if done.returncode != 0:
        raise SystemExit(f"{name}: rtrain exited {done.returncode}\n{done.stderr[-3000:]}")
    final = json.loads((out / "final_rank0.json").read_text())
    steps = [json.loads(line) for line in (out / "steps_rank0.jsonl").read_text().splitlines()]
    half = steps[len(steps) // 2 :]
    slowest = args.nproc - 1
    held = [json.loads(x)["logical"] for x in (out / f"steps_rank{slowest}.jsonl").open()]
    events = [
        json.loads(line)
        for path in (tmp / "logs" / name).rglob("events.jsonl")
        for line in path.read_text().splitlines()
        if '"straggler' in line
    ]
    return {
        "run": name,
        "digest": final["digest"],
        "steps_per_s": args.steps / final["seconds"],
        "steady_steps_per_s": (len(half) - 1) / (half[-1]["t"] - half[0]["t"]),
        "boundary_ms_per_step": 1000 * final["boundary_s"] / args.steps,
        "last_rank_held": len(held[-1]),
        "straggler_events": [(e["event"], e.get("rank"), e.get("slower")) for e in events],
    }


def bookkeeping_us(tmp: Path, calls: int = 100_000) -> float:
    """Microseconds the worker's pace bookkeeping adds to a step."""
    os.environ["RTRAIN_HEARTBEAT_FILE"] = str(tmp / "bench.beat")
    from rtrain.core.worker import pace

    began = time.perf_counter()
    for _ in range(calls):
        pace.begin(4)
        pace.computed()
        pace.waited(0.0)
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--slow-ms", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        results = [run(name, mode, slow, args, tmp) for name, mode, slow in RUNS]
        cost_us = bookkeeping_us(tmp)
    by = {r["run"]: r for r in results}
    assert len({r["digest"] for r in results}) == 1, "the runs' results differ"
    step_s = 1 / by["unslowed"]["steady_steps_per_s"]
    print(
        f"{args.nproc} ranks x {args.micro} micro-batches, {args.steps} steps, work "
        f"{args.work_ms:g} ms/logical rank, rank {args.nproc - 1} +{args.slow_ms:g} ms"
    )
    print(
        "| run | steps/s (whole run) | steps/s (last half) | slow rank's logical ranks at "
        "the end | ms/step in data_ranks() | events |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['run']} | {r['steps_per_s']:.2f} | {r['steady_steps_per_s']:.2f} | "
            f"{r['last_rank_held']} | {r['boundary_ms_per_step']:.3f} | "
            f"{r['straggler_events']} |"
        )
    gain = by["balanced"]["steps_per_s"] / by["unmitigated"]["steps_per_s"]
    steady = by["balanced"]["steady_steps_per_s"] / by["unmitigated"]["steady_steps_per_s"]
    ceiling = by["balanced"]["steady_steps_per_s"] / by["unslowed"]["steady_steps_per_s"]
    print(
        f"balanced / unmitigated: {gain:.2f}x whole run, {steady:.2f}x last half; "
        f"balanced / unslowed (last half): {ceiling:.2f}"
    )
    print(
        f"detection bookkeeping: {cost_us:.2f} us a step = "
        f"{100 * cost_us * 1e-6 / step_s:.4f} % of the unslowed step ({step_s * 1000:.1f} ms)"
    )
    print("identical digests: yes")
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, "bookkeeping_us": cost_us}, indent=1))


if __name__ == "__main__":
    main()
