"""Benchmark fault -> the survivors' next completed step, side by side, in interleaved runs:
train through, repair in place, rtrain's process restart, torchrun, nvidia-resiliency-ext's
ft_launcher and torchft (lighthouse over gloo), on the same job
(scripts/bench_repair_worker.py: 2 ranks on localhost, --state-mb of extra state per rank,
rank 1 SIGKILLs itself at step 8, or SIGSTOPs itself with --fault hang).

  through      rtrain launch, rtrain.repairable(train_through=True): the kept rank trains
               on at once and does the failed rank's data share (the global batch kept)
  spare        the same with --spares-per-node=1: a spare runs the start-up ahead and
               takes rank 1's place (the fault waits, past its step, until it is warm)
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

--window W (train through a fault, issue 46): each run goes on W s after the fault for
(a), (b) and (c) (scripts/bench_through.py), against --fault none runs. --startup-s S
(a list, interleaved): every process started after the first generation sleeps S s at
module level (a GPU process's cold start), in every launcher alike. --fault hang stops
rank 1 (SIGSTOP): rtrain gets --hang-timeout=H, ft_launcher --ft-rank_heartbeat_timeout=H
(torchrun has no such setting); under --window torchft's lighthouse heartbeat and process
group timeouts are H too, and the harness restarts its replica process that exits.

    python scripts/bench_repair.py --runs 3 --state-mb 100 --peers-venv /tmp/peers
    python scripts/bench_repair.py --runs 2 --window 60 --startup-s 0,10 --fault crash,none \
        --peers-venv /tmp/peers
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

from rtrain.core.errors import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_repair_table import markdown, print_table, summarize
from bench_through import Window, dump, measure_windows, plan, report, watch_window
from bench_through import load as load_runs
from bench_through_args import Setup, parse, refusal

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "scripts" / "bench_repair_worker.py")
LAUNCHERS = ("through", "spare", "repair", "rtrain", "torchrun", "ft_launcher", "torchft")
MODES = {"through": "through", "spare": "through", "repair": "repair", "rtrain": "snapshot"}
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


def spec(launcher: str, peers: Path | None, setup: Setup | None = None) -> Spec:
    setup = setup or Setup()
    hang = f"{setup.hang_timeout:g}"
    if launcher in MODES:
        if launcher != "rtrain" and not repair_hook_available():
            return Spec(missing="rtrain.core.worker.repair is not there yet")
        watch = [f"--hang-timeout={hang}"] if setup.fault == "hang" else []
        env = {"BENCH_MODE": MODES[launcher]}
        if launcher == "spare":  # one warm spare per node; the fault waits for it
            watch.append("--spares-per-node=1")
            env["BENCH_WAIT_SPARE"] = "1"
        rtrain = [sys.executable, "-m", "rtrain.cli.main", "launch", *TORCHRUN_FLAGS, *watch]
        return Spec([([*rtrain, WORKER], env)])
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", *TORCHRUN_FLAGS, WORKER]
        return Spec([(cmd, {"BENCH_MODE": "disk"})])
    tool = peers / "bin" / PEERS[launcher] if peers else None
    if tool is None or not tool.exists():
        return Spec(missing=f"not installed ({PEERS[launcher]}: see --peers-venv)")
    if launcher == "ft_launcher":
        watch = []
        if setup.fault == "hang":  # its rank monitor's heartbeat timeout, checked each 1 s
            watch = [
                f"--ft-rank_heartbeat_timeout={hang}",
                "--ft-initial_rank_heartbeat_timeout=600",
                "--ft-workload_check_interval=1",
            ]
        return Spec([([str(tool), *TORCHRUN_FLAGS, *watch, WORKER], {"BENCH_MODE": "disk"})])
    return _torchft(tool, peers, setup)  # type: ignore[arg-type]


def _torchft(tool: Path, peers: Path, setup: Setup) -> Spec:
    port = _free_port()
    lighthouse = [str(tool), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}"]
    timeout = {}
    if setup.window:  # the 3 s of the others' hang timeouts, for its detection too
        lighthouse += ["--heartbeat_timeout_ms", f"{int(setup.hang_timeout * 1000)}"]
        timeout = {"BENCH_TORCHFT_TIMEOUT_S": f"{setup.hang_timeout:g}"}
    replicas = [
        (
            [str(peers / "bin" / "python"), WORKER],
            {
                **timeout,
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
            with contextlib.suppress(ValueError, IndexError):
                began, ended = line.split()[:2]
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


def run_once(
    launcher: str, peers: Path | None, state_mb: float, timeout: float, setup: Setup | None = None
) -> Outcome | Window:
    setup = setup or Setup()
    plan = spec(launcher, peers, setup)
    if plan.missing:
        return Window(status=plan.missing) if setup.window else Outcome(status=plan.missing)
    with tempfile.TemporaryDirectory(prefix="bench_repair_") as tmp:
        out = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "BENCH_"))}
        base.update(BENCH_OUT=tmp, BENCH_STATE_MB=str(state_mb), OMP_NUM_THREADS="1")
        base.update(BENCH_FAULT=setup.fault, BENCH_STARTUP_S=f"{setup.startup_s:g}")
        base.update(BENCH_FAULT_STEP=str(setup.fault_step))
        if setup.window:
            base["BENCH_STEPS"] = "1000000"  # the harness ends the run after the window
        procs: list[subprocess.Popen] = []
        logs = []

        def start(index: int, restarted: bool = False) -> subprocess.Popen:
            cmd, extra = plan.procs[index]
            again = {"BENCH_RESTARTED": "1", "MASTER_PORT": str(_free_port())}
            log = open(out / f"proc{index}{'r' if restarted else ''}.log", "a")  # noqa: SIM115
            logs.append(log)
            env = {**base, **extra, **(again if restarted else {})}
            return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

        for i in range(len(plan.procs)):
            procs.append(start(i))
            if i == 0 and launcher == "torchft":
                time.sleep(0.5)  # the lighthouse binds before the replicas dial it
        try:
            if setup.window:
                restart = (lambda i: start(i, True)) if launcher == "torchft" else None
                return watch_window(out, procs, setup.window, timeout, restart)
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
    launchers: Sequence[str],
    runs: int,
    peers: Path | None,
    state_mb: float,
    timeout: float,
    setup: Setup | None = None,
) -> dict[str, list[Outcome]]:
    results: dict[str, list[Outcome]] = {name: [] for name in launchers}
    for index in range(runs):  # interleaved: one run of each launcher per round
        for name in launchers:
            outcome = run_once(name, peers, state_mb, timeout, setup)
            assert isinstance(outcome, Outcome)
            results[name].append(outcome)
            figure = f"{outcome.recovery:.2f} s" if outcome.recovery is not None else "-"
            print(f"run {index + 1} {name}: {outcome.status} {figure}", file=sys.stderr)
            if outcome.log and outcome.status != "recovered":
                print("  " + outcome.log.replace("\n", "\n  "), file=sys.stderr)
    return results


def windows(args: argparse.Namespace, launchers: list[str], peers: Path | None) -> int:
    """--window: (a), (b) and (c) over every start-up and fault asked for, interleaved."""
    startups, faults = [float(s) for s in args.startup_s.split(",") if s], args.fault.split(",")
    order = plan(launchers, startups, [f for f in faults if f], args.skip.split(","))

    def run(launcher: str, fault: str, startup: float) -> Window:
        setup = Setup(fault, startup, args.window, args.hang_timeout, args.fault_step)
        return run_once(launcher, peers, args.state_mb, args.timeout, setup)  # type: ignore[return-value]

    loads = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    results = measure_windows(run, order, args.runs, lambda r: dump(r, args.json, args.window))
    loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(
        f"{args.runs} interleaved round(s), {args.state_mb:g} MB of extra state per rank, "
        f"2 ranks, gloo, fault at step {args.fault_step}, hang timeout "
        f"{args.hang_timeout:g} s; load average {loads[0]} -> {loads[1]}."
    )
    print(report(results, args.window))
    return ExitCode.SUCCESS


def main(argv: list[str]) -> int:
    args = parse(argv, __doc__.splitlines()[0], LAUNCHERS)
    launchers = [name for name in args.launchers.split(",") if name]
    refused = refusal(args, launchers, LAUNCHERS)
    if refused:
        print(f"bench_repair: {refused} (launchers: {', '.join(LAUNCHERS)})", file=sys.stderr)
        return 64
    if args.from_json:  # no runs: the tables of runs written earlier by --json
        results, window = load_runs(args.from_json.split(","))
        print(report(results, window))
        return ExitCode.SUCCESS
    peers = Path(args.peers_venv) if args.peers_venv else None
    if args.window:
        return windows(args, launchers, peers)
    setup = Setup(args.fault, float(args.startup_s), 0.0, args.hang_timeout, args.fault_step)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = summarize(measure(launchers, args.runs, peers, args.state_mb, args.timeout, setup))
    print_table(rows, load)
    print(markdown(rows, args.state_mb, args.runs, load))
    return ExitCode.SUCCESS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
