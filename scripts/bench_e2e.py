"""End-to-end recovery of a job with a large state: rtrain's memory vs torchrun's disk.

The job is tests/scripts/train_snapshot.py on one node with 2 workers, each holding
`mb` MB of state, killed (rank 1, SIGKILL) at step 8 of 14:

  rtrain          --max-restarts=1, snapshot() every step, restore() from memory
  torchrun        --max-restarts=1, torch.save every step, torch.load on restart
  torchrun+launch torchrun --max-restarts=0, then a fresh torchrun of the same job (what
                  a requeue does, without the scheduler's delay), torch.load at start

Recovery: the fault -> the first step completed after the state was restored (the
latest such time over the ranks). Used by bench_snapshot.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "train_snapshot.py")
TIMEOUT_S = 120.0
RTRAIN = [sys.executable, "-m", "rtrain.cli.main", "launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
FLAGS = ["--standalone", "--nproc-per-node=2"]


def _env(out: Path, mb: int, disk: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "PROBE_"))}
    env.update(
        PROBE_OUT=str(out),
        PROBE_STEPS="14",
        PROBE_STEP_SLEEP="0",
        PROBE_STATE_MB=str(mb),
        PROBE_FAULT="rank=1,step=8,gen=0,action=kill",
        OMP_NUM_THREADS="1",
        TORCH_CPP_LOG_LEVEL="FATAL",
    )
    if disk:
        (out / "disk").mkdir()
        env["PROBE_DISK_CKPT"] = str(out / "disk")
    return env


def _launch(cmd: list[str], env: dict[str, str]) -> int | None:
    """Run a launcher; on timeout kill it with everything it started (a hung torchrun
    restart leaves workers behind otherwise)."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *(c.pid for c in _children(proc.pid))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        return None


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _recovery(out: Path) -> float | None:
    fault = out / "fault.json"
    firsts = list(out.glob("first_step_*.json"))
    if not fault.exists() or len(firsts) < 2:
        return None
    t_fault = json.loads(fault.read_text())["t_fault"]
    return max(json.loads(p.read_text())["t"] for p in firsts) - t_fault


def run_once(kind: str, mb: int) -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if kind == "rtrain":
            _launch([*RTRAIN, *FLAGS, "--max-restarts=1", SCRIPT], _env(out, mb, disk=False))
        elif kind == "torchrun":
            _launch([*TORCHRUN, *FLAGS, "--max-restarts=1", SCRIPT], _env(out, mb, disk=True))
        else:
            env = _env(out, mb, disk=True)
            first = _launch([*TORCHRUN, *FLAGS, "--max-restarts=0", SCRIPT], env)
            if first not in (None, 0):
                _launch([*TORCHRUN, *FLAGS, "--max-restarts=0", SCRIPT], env)
        return _recovery(out)


def end_to_end(mb: int, runs: int) -> dict:
    kinds = {
        "rtrain": "rtrain, in-job restart, restore from memory",
        "torchrun": "torchrun --max-restarts=1, torch.load from disk",
        "relaunch": "torchrun, fresh launch after the crash, torch.load from disk",
    }
    results: dict[str, list[float | None]] = {k: [] for k in kinds}
    for _ in range(runs):
        for kind in kinds:
            results[kind].append(run_once(kind, mb))
    medians = {}
    lines = [
        f"End-to-end recovery, {mb} MB of state per worker, 2 workers, one killed at step 8 "
        f"(median of {runs}; `never`: no step after the fault within {TIMEOUT_S:g} s):",
        "",
        "| launcher | recovery (fault -> first step with state restored) | runs recovered |",
        "|---|---|---|",
    ]
    for kind, label in kinds.items():
        values = [v for v in results[kind] if v is not None]
        medians[kind] = statistics.median(values) if values else None
        shown = "never" if medians[kind] is None else f"{medians[kind]:.2f} s"
        lines.append(f"| {label} | {shown} | {len(values)} of {runs} |")
    ours = medians["rtrain"]
    best_torch = min((v for k, v in medians.items() if k != "rtrain" and v), default=None)
    if ours and best_torch:
        lines += ["", f"Speed-up over torchrun's best: {best_torch / ours:.1f}x (target >= 5x)."]
    return {"lines": lines, "medians": medians}
