"""Benchmark fault recovery: rtrain and torchrun on the same job with the same faults.

The job: tests/scripts/train_resumable.py (checkpoints every step, resumes from the
last one) on 2 nodes x 2 workers on localhost, `--nnodes=1:2 --max-restarts=3`, c10d
rendezvous. Faults, injected for real once training is under way:

  worker crash   rank 1 exits with code 3 at step 5
  node loss      node 1 (its launcher and workers) is SIGKILLed after step 5; the
                 kernel closes its sockets, so peers' collectives fail at once
  silent loss    node 1 is SIGSTOPped instead: no socket closes, as when a machine
                 dies or its network is cut; only a lease (or a timeout) can tell
  hung worker    rank 1 SIGSTOPs itself at step 5 (rtrain: --hang-timeout=5)

Figures, per launcher, median over --runs runs (interleaved):

  detection  fault -> the last surviving launcher logs that it noticed (its first log
             line after the fault; torchrun's glog lines, rtrain's own)
  recovery   fault -> the first training step completed by the generation that
             finished the job

A run that does not finish within --timeout counts as "not recovered within N s".
rtrain runs with its defaults (lease renewed every 1 s, node lost after 5 s).

    python scripts/bench_recovery.py --runs 3 --timeout 60
    python scripts/bench_recovery.py --events-cost --runs 3 --scenarios crash,node

--events-cost measures rtrain against itself instead: events and a --metrics-file on
against --events=off, interleaved the same way, in a section of its own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from bench_launch import section_head, write_doc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "train_resumable.py")
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "rtrain": [sys.executable, "-m", "rtrain.cli.main", "launch"],
}
# --events-cost: rtrain with events and a metrics file, and with neither.
OBSERVE = {
    "observed": [*LAUNCHERS["rtrain"], "--events=on"],
    "quiet": [*LAUNCHERS["rtrain"], "--events=off"],
}
SCENARIOS = {
    "crash": ("worker crash", "rank=1,step=5,gen=0,action=exit"),
    "node": ("node loss (SIGKILL)", ""),
    "freeze": ("silent node loss (SIGSTOP)", ""),
    "hang": ("hung worker (SIGSTOP)", "rank=1,step=5,gen=0,action=stop"),
}
STEPS = 60
MARK_BEGIN, MARK_END = "<!-- bench_recovery:begin -->", "<!-- bench_recovery:end -->"
EVENTS_BEGIN = "<!-- bench_recovery_events:begin -->"
EVENTS_END = "<!-- bench_recovery_events:end -->"
RTRAIN_LINE = re.compile(r"^\[rtrain (\d\d:\d\d:\d\d\.\d{3}) ")
GLOG_LINE = re.compile(r"^[WEI]\d{4} (\d\d:\d\d:\d\d\.\d{6}) ")


@dataclass
class Outcome:
    detection: float | None = None
    recovery: float | None = None
    status: str = "recovered"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(
    launcher: str, index: int, port: int, env: dict[str, str], log: Path
) -> subprocess.Popen:
    cmd = [
        *{**LAUNCHERS, **OBSERVE}[launcher],
        "--nnodes=1:2",
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--local-addr=127.0.0.{index + 1}",
        "--rdzv-id=bench",
    ]
    if launcher != "torchrun":
        cmd += [f"--rdzv-conf=is_host={'true' if index == 0 else 'false'}", "--hang-timeout=5"]
    if launcher == "observed":
        cmd += [f"--log-dir={log.parent}/logs{index}", f"--metrics-file={log.parent}/{index}.prom"]
    handle = open(log, "w")  # noqa: SIM115 - the launcher writes to it until it exits
    return subprocess.Popen(
        [*cmd, SCRIPT], env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT
    )


def _signal_tree(proc: subprocess.Popen, *signals: int) -> None:
    """Send each signal to the launcher and every process under it (pool, workers)."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in tree:
        for sig in signals:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)


def _stop_tree(proc: subprocess.Popen) -> None:
    _signal_tree(proc, signal.SIGSTOP)


def _kill_tree(proc: subprocess.Popen) -> None:
    _signal_tree(proc, signal.SIGCONT, signal.SIGKILL)


def _progress(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def _noticed(log: Path, after: float) -> float | None:
    """Epoch time of the launcher's first own log line after `after`."""
    today = datetime.date.today()
    for line in log.read_text(errors="replace").splitlines():
        match = RTRAIN_LINE.match(line) or GLOG_LINE.match(line)
        if not match:
            continue
        clock = datetime.time.fromisoformat(match.group(1))
        stamp = datetime.datetime.combine(today, clock).timestamp()
        if stamp >= after:
            return stamp
    return None


def run_once(launcher: str, scenario: str, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "PROBE_"))}
        env.update(
            PROBE_OUT=str(out),
            PROBE_CKPT=str(out / "ckpt.pt"),
            PROBE_STEPS=str(STEPS),
            PROBE_FAULT=SCENARIOS[scenario][1],
            OMP_NUM_THREADS="1",
            TORCH_CPP_LOG_LEVEL="FATAL",
        )
        port = _free_port()
        logs = [out / "node0.log", out / "node1.log"]
        procs = [_start(launcher, i, port, env, logs[i]) for i in range(2)]
        try:
            return _observe(scenario, timeout, out, procs, logs)
        finally:
            for proc in procs:
                _kill_tree(proc)
                proc.wait()


def _observe(
    scenario: str, timeout: float, out: Path, procs: list[subprocess.Popen], logs: list[Path]
) -> Outcome:
    end = time.monotonic() + timeout
    survivors = [0, 1]
    if scenario in ("node", "freeze"):
        while _progress(out) < 5:
            if time.monotonic() > end or any(p.poll() is not None for p in procs):
                return Outcome(status="failed before the fault")
            time.sleep(0.05)
        t_fault = time.time()
        (_kill_tree if scenario == "node" else _stop_tree)(procs[1])
        survivors = [0]
    for index in survivors:
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[index].wait(timeout=max(end - time.monotonic(), 0.1))
    if scenario in ("crash", "hang"):
        fault_file = out / "fault_rank1.json"
        if not fault_file.exists():
            return Outcome(status="failed before the fault")
        t_fault = json.loads(fault_file.read_text())["t_fault"]
    noticed = [_noticed(logs[i], t_fault) for i in survivors]
    detection = max(noticed) - t_fault if all(n is not None for n in noticed) else None
    if any(procs[i].poll() is None for i in survivors):
        return Outcome(detection, None, f"not recovered within {timeout:g} s")
    codes = sorted({procs[i].returncode for i in survivors})
    if codes != [0]:
        return Outcome(detection, None, f"failed (exit {', '.join(map(str, codes))})")
    firsts = [
        rec["t_first_step"]
        for path in out.glob("gen*_rank*.json")
        if (rec := json.loads(path.read_text()))["t_start"] > t_fault
    ]
    return Outcome(detection, min(firsts) - t_fault if firsts else None)


def measure(
    runs: int,
    timeout: float,
    launchers: Sequence[str] = tuple(LAUNCHERS),
    scenarios: Sequence[str] = tuple(SCENARIOS),
) -> dict[tuple[str, str], list[Outcome]]:
    results: dict[tuple[str, str], list[Outcome]] = {}
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("recovery runs", total=runs * len(scenarios) * len(launchers))
        for scenario in scenarios:
            for _ in range(runs):
                for launcher in launchers:
                    results.setdefault((launcher, scenario), []).append(
                        run_once(launcher, scenario, timeout)
                    )
                    progress.advance(task)
    return results


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(
    results: dict[tuple[str, str], list[Outcome]], launchers: Sequence[str] = tuple(LAUNCHERS)
) -> list[dict]:
    rows = []
    for scenario, (label, _) in SCENARIOS.items():
        if (launchers[0], scenario) not in results:
            continue
        row: dict = {"label": label}
        for launcher in launchers:
            outcomes = results[(launcher, scenario)]
            statuses = [o.status for o in outcomes]
            row[launcher] = {
                "detection": _median([o.detection for o in outcomes]),
                "recovery": _median([o.recovery for o in outcomes if o.status == "recovered"]),
                "outcomes": ", ".join(f"{statuses.count(s)}x {s}" for s in dict.fromkeys(statuses)),
            }
        first, second = (row[launcher]["recovery"] for launcher in launchers)
        row["speedup"] = first / second if first and second else None  # cost: on / off
        rows.append(row)
    return rows


def _fmt(value: float | None, unit: str = " s") -> str:
    if value is None:
        return "n/a" if unit == "x" else "never"
    return f"{value:.2f}{unit}" if unit != "x" else f"{value:.1f}x"


def render(rows: list[dict], runs: int, timeout: float, command: str) -> str:
    lines = [
        *section_head(MARK_BEGIN, "Fault recovery (`scripts/bench_recovery.py`)", command),
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}. "
        "Job: 2 nodes x 2 workers on localhost (gloo, CPU), `--nnodes=1:2 --max-restarts=3`, "
        f"checkpoint every step; median of {runs} interleaved runs, {time.strftime('%Y-%m-%d')}. "
        "rtrain with its default lease (1 s renewals, lost after 5 s) and `--hang-timeout=5`. "
        "Detection: fault -> the last surviving launcher logs it noticed; recovery: fault -> "
        "first step of the generation that finished the job. `never`: not within "
        f"{timeout:g} s or the launcher gave up.",
        "",
        "| fault | torchrun detection | torchrun recovery | rtrain detection | rtrain recovery "
        "| speed-up | torchrun outcomes | rtrain outcomes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(row, "torchrun", "rtrain", _fmt(row["speedup"], "x")) for row in rows]
    lines += [
        "",
        "Targets (issue 3): node loss recovered in under 10 s with default settings; a hung "
        "worker detected within hang-timeout + 1 s.",
        MARK_END,
    ]
    return "\n".join(lines)


def _row(row: dict, first: str, second: str, compared: str) -> str:
    """A fault's table row: two launchers' detection and recovery, compared, outcomes."""
    a, b = row[first], row[second]
    return (
        f"| {row['label']} | {_fmt(a['detection'])} | {_fmt(a['recovery'])} | "
        f"{_fmt(b['detection'])} | {_fmt(b['recovery'])} | {compared} | "
        f"{a['outcomes']} | {b['outcomes']} |"
    )


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_cost(rows: list[dict], runs: int, command: str) -> str:
    title = "What events and metrics cost in recovery (`scripts/bench_recovery.py`)"
    lines = [
        *section_head(EVENTS_BEGIN, title, command),
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}. "
        "The job and faults above, rtrain only: `--events=on --metrics-file=...` against "
        f"`--events=off`; median of {runs} interleaved runs, {time.strftime('%Y-%m-%d')}.",
        "",
        "| fault | on: detection | on: recovery | off: detection | off: recovery "
        "| recovery on / off | outcomes on | outcomes off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(row, "observed", "quiet", ratio(row["speedup"])) for row in rows]
    lines += ["", "Target (issue 18): on / off within the runs' own spread.", EVENTS_END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--events-cost", action="store_true", help="events on vs off")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    if args.events_cost:
        launchers = tuple(OBSERVE)
        rows = summarize(measure(args.runs, args.timeout, launchers, scenarios), launchers)
        command = (
            f"python scripts/bench_recovery.py --events-cost --runs {args.runs} "
            f"--scenarios {args.scenarios}"
        )
        section = render_cost(rows, args.runs, command)
        print(section)
        write_doc(section, Path(args.doc), EVENTS_BEGIN, EVENTS_END)
        return
    rows = summarize(measure(args.runs, args.timeout, scenarios=scenarios))
    table = Table(title="fault recovery: torchrun vs rtrain (median seconds after the fault)")
    for column in ("fault", "launcher", "detection", "recovery", "outcomes"):
        table.add_column(column)
    for row in rows:
        for launcher in LAUNCHERS:
            figures = row[launcher]
            table.add_row(
                row["label"],
                launcher,
                _fmt(figures["detection"]),
                _fmt(figures["recovery"]),
                figures["outcomes"],
            )
    Console().print(table)
    command = f"python scripts/bench_recovery.py --runs {args.runs} --timeout {args.timeout:g}"
    write_doc(render(rows, args.runs, args.timeout, command), Path(args.doc), MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
