"""Train through a fault: what scripts/bench_repair.py measures with --window W (issue 46).

For each run, from the worker's step files (scripts/bench_repair_worker.py):

  (a) next step   fault -> the end of the first step begun after the fault and completed
                  by any process (the survivors' next completed step)
  (b) full size   fault -> the end of the first step begun after the fault in which every
                  rank (every replica group under torchft) took part: the job at full
                  size again
  (c) samples     logical data shares (one rank's batch of one step) first completed in
                  the W seconds after the fault, against the same count in a run
                  without the fault (--fault none: the marker is written at the same step,
                  nothing is killed), and against the pre-fault rate times W

A run lasts until W seconds after the fault; the harness then ends every process it
started. torchft has no launcher: the harness restarts a replica process that exits (as
a scheduler would), with BENCH_RESTARTED=1; a stopped one (--fault hang) it leaves alone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

FULL_WORLD = 2


@dataclass
class Window:
    status: str = "recovered"
    next_step: float | None = None  # (a)
    full_size: float | None = None  # (b)
    samples: int | None = None  # (c): logical shares first done within the window
    pre_rate: float | None = None  # logical shares a second before the fault
    kept: bool = False
    step_s: float | None = None
    log: str = ""


@dataclass(frozen=True)
class Row:
    pid: int
    began: float
    ended: float
    step: int
    world: int
    shares: tuple[int, ...]


def read_rows(out: Path) -> list[Row]:
    rows = []
    for path in out.glob("steps_*.txt"):
        pid = int(path.stem.split("_")[1])
        for line in path.read_text().splitlines():
            parts = line.split()
            with contextlib.suppress(ValueError, IndexError):
                shares = tuple(int(s) for s in parts[4].split(",") if s)
                began, ended = float(parts[0]), float(parts[1])
                rows.append(Row(pid, began, ended, int(parts[2]), int(parts[3]), shares))
    return rows


def t_fault(out: Path) -> float | None:
    fault = out / "fault.json"
    if not fault.exists():
        return None
    with contextlib.suppress(ValueError, KeyError):
        return float(json.loads(fault.read_text())["t_fault"])
    return None


def first_done(rows: list[Row]) -> dict[tuple[int, int], float]:
    """Each (step, logical share)'s first completion: a share redone after a rollback
    counts once, when first done."""
    done: dict[tuple[int, int], float] = {}
    for row in rows:
        for share in row.shares:
            key = (row.step, share)
            done[key] = min(done.get(key, row.ended), row.ended)
    return done


def judge_window(out: Path, window: float) -> Window:
    fault = t_fault(out)
    if fault is None:
        return Window(status="no fault within the run")
    rows = read_rows(out)
    after = sorted((r for r in rows if r.began > fault), key=lambda r: r.ended)
    done = first_done(rows)
    before = [t for t in done.values() if t <= fault]
    first = min((r.ended for r in rows), default=fault)
    pre_rate = len(before) / (fault - first) if before and fault > first else None
    samples = sum(1 for t in done.values() if fault < t <= fault + window)
    gaps = [
        b.ended - a.ended
        for _, group in itertools.groupby(sorted(rows, key=lambda r: r.pid), lambda r: r.pid)
        for a, b in itertools.pairwise(sorted(group, key=lambda r: r.ended))
        if b.ended <= fault
    ]
    pids_before = {r.pid for r in rows if r.ended <= fault}
    kept = any(r.pid in pids_before for r in after)
    nxt = next((r.ended - fault for r in after if r.ended <= fault + window), None)
    full = next(
        (r.ended - fault for r in after if r.world >= FULL_WORLD and r.ended <= fault + window),
        None,
    )
    status = "recovered" if nxt is not None else f"did not recover within {window:g} s"
    return Window(
        status, nxt, full, samples, pre_rate, kept, statistics.median(gaps) if gaps else None
    )


def watch_window(
    out: Path,
    procs: list[subprocess.Popen],
    window: float,
    timeout: float,
    restart: Callable[[int], subprocess.Popen] | None = None,
) -> Window:
    """Wait until `window` seconds after the fault (or `timeout` without one), restarting
    a replica process that exits after the fault when `restart` is given (torchft)."""
    start = time.monotonic()
    while True:
        fault = t_fault(out)
        if fault is not None and time.time() >= fault + window + 0.2:
            return judge_window(out, window)
        if fault is None and time.monotonic() - start > timeout:
            tail = (out / "proc0.log").read_text(errors="replace")[-400:]
            return Window(status=f"no fault within {timeout:g} s", log=tail)
        if restart is not None and fault is not None:
            for index, proc in enumerate(procs):
                if index > 0 and proc.poll() is not None:
                    procs[index] = restart(index)
        main = procs[1] if restart is not None else procs[0]
        if restart is None and main.poll() is not None:
            judged = judge_window(out, window) if fault is not None else Window()
            judged.status = f"the launcher ended (exit {main.returncode})"
            judged.log = (out / "proc0.log").read_text(errors="replace")[-400:]
            return judged
        time.sleep(0.05)


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: Sequence[float | int | None], unit: str = " s", digits: int = 2) -> str:
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    median = statistics.median(present)
    return f"{median:.{digits}f}{unit} ({present[0]:.{digits}f}-{present[-1]:.{digits}f})"


def summarize_windows(
    results: dict[tuple[str, str, float], list[Window]], window: float
) -> list[dict]:
    """One row per (launcher, fault, start-up S), with (c) against the same launcher's
    fault-free runs in this invocation."""
    free = {
        launcher: _median([w.samples for w in runs])
        for (launcher, fault, _), runs in results.items()
        if fault == "none"
    }
    rows = []
    for (launcher, fault, startup), runs in results.items():
        if fault == "none":
            continue
        samples = _median([w.samples for w in runs])
        base = free.get(launcher)
        pre = _median([w.pre_rate * window for w in runs if w.pre_rate])
        statuses = [w.status for w in runs]
        rows.append(
            {
                "launcher": launcher,
                "fault": fault,
                "startup_s": startup,
                "a": [w.next_step for w in runs],
                "b": [w.full_size for w in runs],
                "c": [w.samples for w in runs],
                "a_median": _median([w.next_step for w in runs]),
                "c_free": base,
                "c_ratio": samples / base if samples is not None and base else None,
                "c_pre_ratio": samples / pre if samples is not None and pre else None,
                "kept": sum(w.kept for w in runs),
                "runs": len(runs),
                "outcomes": ", ".join(f"{statuses.count(s)}x {s}" for s in dict.fromkeys(statuses)),
            }
        )
    return rows


def _ratio(value: float | None, against: float | None) -> str:
    return f"{value / against:.2f}" if value is not None and against else "-"


def markdown_windows(rows: list[dict], free: dict[str, list[Window]], window: float) -> str:
    lines = [
        f"(a) fault -> survivors' next completed step; (b) fault -> full size again; (c) "
        f"logical data shares trained in the {window:g} s after the fault. Median "
        "(min-max).",
        "",
        "| fault | S | launcher | (a) | (a) / torchrun | (a) / rtrain restart "
        "| (a) / torchft | (b) | (c) samples | (c) / fault-free | (c) / pre-fault rate "
        "| kept | outcomes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peer = {
            o["launcher"]: o["a_median"]
            for o in rows
            if o["fault"] == r["fault"] and o["startup_s"] == r["startup_s"]
        }
        lines.append(
            f"| {r['fault']} | {r['startup_s']:g} s | {r['launcher']} | {_spread(r['a'])} | "
            f"{_ratio(r['a_median'], peer.get('torchrun'))} | "
            f"{_ratio(r['a_median'], peer.get('rtrain'))} | "
            f"{_ratio(r['a_median'], peer.get('torchft'))} | {_spread(r['b'])} | "
            f"{_spread(r['c'], '', 0)} | {_f(r['c_ratio'])} | {_f(r['c_pre_ratio'])} | "
            f"{r['kept']} of {r['runs']} | {r['outcomes']} |"
        )
    if free:
        lines += ["", "Fault-free runs (the marker only), samples in the same window:", ""]
        lines += [
            f"- {name}: {_spread([w.samples for w in runs], '', 0)}, {len(runs)} run(s)"
            for name, runs in free.items()
        ]
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def skipped(skip: Sequence[str], launcher: str, startup: float, fault: str) -> bool:
    """--skip entries launcher:S:fault, each part a value or *."""
    for entry in skip:
        name, s, f = ([*entry.split(":"), "*", "*"])[:3]
        if name in ("*", launcher) and s in ("*", f"{startup:g}") and f in ("*", fault):
            return True
    return False


def plan(
    launchers: Sequence[str], startups: Sequence[float], faults: Sequence[str], skip: Sequence[str]
) -> list[tuple[str, str, float]]:
    """One round's runs, interleaved: (launcher, fault, S); a fault-free run once per
    launcher (no process starts after the first generation there: S does not apply)."""
    order = []
    for startup in startups:
        for fault in faults:
            if fault == "none" and startup != startups[0]:
                continue
            for launcher in launchers:
                if not skipped(skip, launcher, startup, fault):
                    order.append((launcher, fault, 0.0 if fault == "none" else startup))
    return order


def measure_windows(
    run: Callable[[str, str, float], Window],
    order: list[tuple[str, str, float]],
    runs: int,
    done: Callable[[dict[tuple[str, str, float], list[Window]]], None] = lambda _: None,
) -> dict[tuple[str, str, float], list[Window]]:
    """Every run of `order`, `runs` rounds; `done` is handed the results after each run."""
    results: dict[tuple[str, str, float], list[Window]] = {key: [] for key in order}
    for index in range(runs):
        for key in order:
            launcher, fault, startup = key
            load = f"{os.getloadavg()[0]:.1f}"
            window = run(launcher, fault, startup)
            results[key].append(window)
            done({k: v for k, v in results.items() if v})
            print(
                f"run {index + 1} {launcher} fault={fault} S={startup:g} (load {load}): "
                f"{window.status} a={_f(window.next_step)} b={_f(window.full_size)} "
                f"c={window.samples} pre-rate={_f(window.pre_rate)}/s kept={window.kept}",
                file=sys.stderr,
                flush=True,
            )
            if window.log and window.status != "recovered":
                print("  " + window.log.replace("\n", "\n  "), file=sys.stderr)
    return results


def report(results: dict[tuple[str, str, float], list[Window]], window: float) -> str:
    rows = summarize_windows(results, window)
    free = {k[0]: runs for k, runs in results.items() if k[1] == "none"}
    return markdown_windows(rows, free, window)


def dump(results: dict[tuple[str, str, float], list[Window]], path: str, window: float) -> None:
    if not path:
        return
    records = [
        {"launcher": k[0], "fault": k[1], "startup_s": k[2], "window": window, **w.__dict__}
        for k, runs in results.items()
        for w in runs
    ]
    Path(path).write_text(json.dumps(records, indent=1))


def load(paths: Sequence[str]) -> tuple[dict[tuple[str, str, float], list[Window]], float]:
    """--from-json: the runs of earlier invocations (dump's files), merged in order."""
    results: dict[tuple[str, str, float], list[Window]] = {}
    windows = set()
    for path in paths:
        for record in json.loads(Path(path).read_text()):
            key = (record.pop("launcher"), record.pop("fault"), float(record.pop("startup_s")))
            windows.add(record.pop("window"))
            results.setdefault(key, []).append(Window(**record))
    if len(windows) != 1:
        raise ValueError(f"runs of different windows cannot be put together: {sorted(windows)}")
    return results, windows.pop()
