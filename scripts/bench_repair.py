"""Benchmark fault -> the survivors' next completed step, side by side, in interleaved runs:
repair in place, rtrain's process restart, torchrun, nvidia-resiliency-ext's ft_launcher
and torchft (lighthouse over gloo), on the same job (scripts/bench_repair_worker.py: 2
ranks on localhost, --state-mb of extra state per rank, rank 1 SIGKILLs itself at step 8).

  repair       rtrain launch, the job opts in with rtrain.repairable (repair in place)
  rtrain       rtrain launch, rtrain.snapshot/restore: every worker restarts from the pool
  torchrun     torch.distributed.run --max-restarts=3, a torch.save checkpoint every step
  ft_launcher  nvidia-resiliency-ext's torchrun fork, the same job and checkpoints
  torchft      torchft_lighthouse + one process per replica group (no launcher); the
               healthy group steps on without the failed one (min_replica_size=1)

Recovery: fault (fault.json's t_fault, written just before the SIGKILL) -> the end of the
first step begun after it and completed (torchft: committed) by any rank. "kept": a
process that stepped before the fault stepped after it too (the survivor kept its
process). The peers run from their own environment (--peers-venv, a venv made with
--system-site-packages so it uses this torch: `python -m venv --system-site-packages V;
V/bin/pip install nvidia-resiliency-ext torchft`); without it they are reported as not
installed. Repair in place plugs in through repair_hook_available() (rtrain.core.worker.repair)
and the worker's run_repair() (rtrain.repairable).

    python scripts/bench_repair.py --runs 3 --state-mb 100 --peers-venv /tmp/peers
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from rtrain.core.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "scripts" / "bench_repair_worker.py")
LAUNCHERS = ("repair", "rtrain", "torchrun", "ft_launcher", "torchft")
PEERS = {"ft_launcher": "ft_launcher", "torchft": "torchft_lighthouse"}
TORCHRUN_FLAGS = ["--standalone", "--nproc-per-node=2", "--max-restarts=3"]


@dataclass
class Outcome:
    recovery: float | None = None
    status: str = "recovered"
    kept: bool = False
    step_s: float | None = None  # median step interval before the fault
    log: str = ""


@dataclass
class Spec:
    """The processes one launcher's run starts: (command, extra environment) each."""

    procs: list[tuple[list[str], dict[str, str]]] = field(default_factory=list)
    missing: str = ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def repair_hook_available() -> bool:
    """Repair in place plugs in here: rtrain.core.worker.repair (H8's worker API)."""
    try:
        import rtrain.core.worker.repair  # noqa: F401
    except ImportError:
        return False
    return True


def spec(launcher: str, peers: Path | None) -> Spec:
    rtrain = [sys.executable, "-m", "rtrain.cli.main", "launch", *TORCHRUN_FLAGS]
    if launcher in ("repair", "rtrain"):
        if launcher == "repair" and not repair_hook_available():
            return Spec(missing="rtrain.core.worker.repair is not there yet")
        mode = "repair" if launcher == "repair" else "snapshot"
        return Spec([([*rtrain, WORKER], {"BENCH_MODE": mode})])
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", *TORCHRUN_FLAGS, WORKER]
        return Spec([(cmd, {"BENCH_MODE": "disk"})])
    tool = peers / "bin" / PEERS[launcher] if peers else None
    if tool is None or not tool.exists():
        return Spec(missing=f"not installed ({PEERS[launcher]}: see --peers-venv)")
    if launcher == "ft_launcher":
        return Spec([([str(tool), *TORCHRUN_FLAGS, WORKER], {"BENCH_MODE": "disk"})])
    port = _free_port()
    lighthouse = [str(tool), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}"]
    replicas = [
        (
            [str(peers / "bin" / "python"), WORKER],  # type: ignore[operator]
            {
                "BENCH_MODE": "torchft",
                "REPLICA_GROUP_ID": str(group),
                "RANK": "0",
                "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}",
            },
        )
        for group in (0, 1)
    ]
    return Spec([(lighthouse, {}), *replicas])


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGKILL)


def _steps(out: Path) -> dict[int, list[tuple[float, float]]]:
    """Each process's steps: (began, ended), by pid."""
    steps: dict[int, list[tuple[float, float]]] = {}
    for path in out.glob("steps_*.txt"):
        pid = int(path.stem.split("_")[1])
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                began, ended, _ = line.split()
                steps.setdefault(pid, []).append((float(began), float(ended)))
    return steps


def judge(out: Path) -> Outcome | None:
    """The outcome once a step begun after the fault has completed, else None."""
    fault = out / "fault.json"
    if not fault.exists():
        return None
    t_fault = json.loads(fault.read_text())["t_fault"]
    steps = _steps(out)
    after = [
        (ended, pid) for pid, rows in steps.items() for began, ended in rows if began > t_fault
    ]
    if not after:
        return None
    t_next, _ = min(after)
    gaps = [
        b - a
        for rows in steps.values()
        for (_, a), (_, b) in itertools.pairwise(sorted(rows))
        if b <= t_fault
    ]
    kept = any(  # some process stepped both before the fault and after it
        any(b <= t_fault for b, _ in rows) and any(b > t_fault for b, _ in rows)
        for rows in steps.values()
    )
    step_s = statistics.median(gaps) if gaps else None
    return Outcome(t_next - t_fault, kept=kept, step_s=step_s)


def run_once(launcher: str, peers: Path | None, state_mb: float, timeout: float) -> Outcome:
    plan = spec(launcher, peers)
    if plan.missing:
        return Outcome(status=plan.missing)
    with tempfile.TemporaryDirectory(prefix="bench_repair_") as tmp:
        out = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "BENCH_"))}
        base.update(BENCH_OUT=tmp, BENCH_STATE_MB=str(state_mb), OMP_NUM_THREADS="1")
        procs = []
        logs = []
        for i, (cmd, extra) in enumerate(plan.procs):
            log = open(out / f"proc{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    cmd, env={**base, **extra}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                )
            )
            if i == 0 and launcher == "torchft":
                time.sleep(0.5)  # the lighthouse binds before the replicas dial it
        try:
            return _watch(launcher, out, procs, timeout)
        finally:
            for proc in procs:
                _kill_tree(proc)
                proc.wait()
            for log in logs:
                log.close()


def _watch(launcher: str, out: Path, procs: list[subprocess.Popen], timeout: float) -> Outcome:
    end = time.monotonic() + timeout
    main = procs[1] if launcher == "torchft" else procs[0]  # replica group 0 survives
    while time.monotonic() < end:
        outcome = judge(out)
        if outcome is not None:
            return outcome
        if main.poll() is not None:
            judged = judge(out)
            if judged is not None:
                return judged
            tail = (out / "proc0.log").read_text(errors="replace")[-400:]
            if main.returncode == 0:  # the job ended without a step after the fault
                return Outcome(status="no step after the fault", log=tail)
            return Outcome(status=f"failed (exit {main.returncode})", log=tail)
        time.sleep(0.02)
    tail = (out / "proc0.log").read_text(errors="replace")[-400:]
    return Outcome(status=f"not recovered within {timeout:g} s", log=tail)


def measure(
    launchers: Sequence[str], runs: int, peers: Path | None, state_mb: float, timeout: float
) -> dict[str, list[Outcome]]:
    results: dict[str, list[Outcome]] = {name: [] for name in launchers}
    for index in range(runs):  # interleaved: one run of each launcher per round
        for name in launchers:
            outcome = run_once(name, peers, state_mb, timeout)
            results[name].append(outcome)
            figure = f"{outcome.recovery:.2f} s" if outcome.recovery is not None else "-"
            print(f"run {index + 1} {name}: {outcome.status} {figure}", file=sys.stderr)
            if outcome.log and outcome.status != "recovered":
                print("  " + outcome.log.replace("\n", "\n  "), file=sys.stderr)
    return results


def summarize(results: dict[str, list[Outcome]]) -> list[dict]:
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-mb", type=float, default=100.0, help="extra state per rank")
    parser.add_argument("--timeout", type=float, default=60.0, help="per run, seconds")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--peers-venv", default="", help="venv holding ft_launcher and torchft")
    args = parser.parse_args(argv)
    launchers = [name for name in args.launchers.split(",") if name]
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown or args.runs < 1 or args.state_mb < 0 or args.timeout <= 0:
        what = (
            f"unknown launcher(s) {', '.join(unknown)}"
            if unknown
            else "bad --runs/--state-mb/--timeout"
        )
        print(f"bench_repair: {what} (launchers: {', '.join(LAUNCHERS)})", file=sys.stderr)
        return 64
    peers = Path(args.peers_venv) if args.peers_venv else None
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = summarize(measure(launchers, args.runs, peers, args.state_mb, args.timeout))
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
    print(markdown(rows, args.state_mb, args.runs, load))
    return ExitCode.SUCCESS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
