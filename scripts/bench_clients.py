"""Real clients under rtrain and torchrun, side by side: wall time, steps/s, hangs.

Each client of tests/clients (PyTorch Lightning, HuggingFace accelerate, the
transformers Trainer, FSDP2, torch.distributed.checkpoint, torch.distributed.pipelining
with GPipe and 1F1B) runs --runs times under each launcher, alternating, with
`--standalone --nproc-per-node=2` on CPU/gloo. A run that outlasts --timeout counts as
a hang (its whole process group is killed); a non-zero exit as a failure. The median
wall time (launcher start to exit) and the clients' own steps/s are reported with the
rtrain/torchrun ratios, and whether the final weights were bitwise equal.

Then the crash cases: rank 1 exits with os._exit(3) mid-run with --max-restarts=1, in
Lightning (resume from last.ckpt) and in the DCP script (resume from the newest DCP
checkpoint), --crash-runs times under each launcher.

--clients runs only those clients (comma-separated names); --crash-runs 0 skips the
crash cases. The clients that mark their steps (accelerate, pipelining) add a table of
their first steps, CPU per step and the load average (bench_clients_steps.py), and each
alternating pair's steps/s ratio.

Results go to docs/benchmarks.md between the bench_clients markers, after a run of every
client with the crash cases; a partial run writes the doc only when --doc names one.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bench_clients_steps import STEP_COLUMNS, paired_ratios, step_rows  # noqa: E402
from bench_launch import write_doc  # noqa: E402

from tests.clients.clients import CLIENTS, LAUNCH, Client, results  # noqa: E402
from tests.integration.helpers import RTRAIN, TORCHRUN, probe_env  # noqa: E402

MARK_BEGIN, MARK_END = "<!-- bench_clients:begin -->", "<!-- bench_clients:end -->"
LAUNCHERS = {"torchrun": TORCHRUN, "rtrain": RTRAIN}
CRASHES = {"lightning": "40", "dcp": "17"}  # client -> the step rank 1 crashes at


@dataclass
class Run:
    code: int | None  # None: hung (killed at the timeout)
    wall_s: float
    results: dict[int, dict[str, Any]]
    stderr: str = ""
    load: float = 0.0  # the machine's one-minute load average as the run ended


@dataclass
class Tally:
    runs: list[Run] = field(default_factory=list)

    @property
    def done(self) -> list[Run]:
        return [r for r in self.runs if r.code == 0 and len(r.results) == 2]

    @property
    def hangs(self) -> int:
        return sum(r.code is None for r in self.runs)

    @property
    def failures(self) -> int:
        return sum(r.code not in (None, 0) for r in self.runs)

    def median_wall(self) -> float | None:
        return statistics.median(r.wall_s for r in self.done) if self.done else None

    def median_steps_per_s(self) -> float | None:
        """The client's own rate on rank 0 (the Trainer's, for the transformers one)."""
        rates = [
            r.results[0].get("trainer_steps_per_s") or r.results[0]["steps_per_s"]
            for r in self.done
        ]
        return statistics.median(rates) if rates else None

    def weights(self) -> set[tuple[str, str]]:
        return {(r.results[0]["weights"], r.results[1]["weights"]) for r in self.done}


def launch(
    launcher: str,
    client: Client,
    out: Path,
    timeout: float,
    *flags: str,
    scale: int = 1,
    **env: str,
) -> Run:
    ckpt = out / "ckpt" if client.checkpoints else None
    command = [*LAUNCHERS[launcher], *LAUNCH, *flags, *client.argv(out, ckpt, scale)]
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(
            command,
            env=probe_env(out, **env),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,  # a hung run is killed with all its workers
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        wall = time.monotonic() - started
        errors.seek(0)
        text = errors.read()
    return Run(code, wall, results(out), text[-20000:], os.getloadavg()[0])


def measure_clients(
    runs: int, timeout: float, tmp: Path, scale: int, names: list[str]
) -> dict[str, dict[str, Tally]]:
    tallies = {name: {launcher: Tally() for launcher in LAUNCHERS} for name in names}
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("clients", total=len(names) * runs * len(LAUNCHERS))
        for name in names:
            client = CLIENTS[name]
            for attempt in range(runs):
                for launcher in LAUNCHERS:  # alternating, so drift hits both alike
                    out = tmp / name / f"{launcher}{attempt}"
                    run = launch(launcher, client, out, timeout, scale=scale)
                    tallies[name][launcher].runs.append(run)
                    progress.update(task, advance=1, description=f"{name} ({launcher})")
    return tallies


@dataclass
class CrashRow:
    client: str
    launcher: str
    runs: int
    recovered: int
    same_weights: int
    hangs: int
    why: str


def _why_failed(run: Run) -> str:
    for marker in ("connectFullMesh", "Connection refused", "Connection reset by peer"):
        if marker in run.stderr:
            lines = [line for line in run.stderr.splitlines() if marker in line]
            return lines[-1].strip()[:160]
    return f"exit {run.code}" if run.code is not None else "hung"


def measure_crashes(crash_runs: int, timeout: float, tmp: Path) -> list[CrashRow]:
    """Each crash case under both launchers; the weights are compared with a run of the
    same client without the crash (under torchrun)."""
    rows: list[CrashRow] = []
    if crash_runs <= 0:
        return rows
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("crashes", total=len(CRASHES) * crash_runs * len(LAUNCHERS))
        for name, step in CRASHES.items():
            clean = launch("torchrun", CLIENTS[name], tmp / f"clean-{name}", timeout)
            expected = Tally([clean]).weights()
            for launcher in LAUNCHERS:
                tally = Tally()
                for attempt in range(crash_runs):
                    out = tmp / f"crash-{name}" / f"{launcher}{attempt}"
                    run = launch(
                        launcher,
                        CLIENTS[name],
                        out,
                        timeout,
                        "--max-restarts=1",
                        CLIENT_CRASH_STEP=step,
                    )
                    tally.runs.append(run)
                    progress.update(task, advance=1, description=f"crash {name} ({launcher})")
                same = sum(
                    (r.results[0]["weights"], r.results[1]["weights"]) in expected
                    for r in tally.done
                )
                failed = [r for r in tally.runs if r not in tally.done]
                rows.append(
                    CrashRow(
                        name,
                        launcher,
                        crash_runs,
                        len(tally.done),
                        same,
                        tally.hangs,
                        _why_failed(failed[0]) if failed else "",
                    )
                )
    return rows


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or theirs is None or theirs == 0 else ours / theirs


def client_rows(tallies: dict[str, dict[str, Tally]]) -> list[list[str]]:
    rows = []
    for name, by in tallies.items():
        ours, theirs = by["rtrain"], by["torchrun"]
        wall = _ratio(ours.median_wall(), theirs.median_wall())
        rate = _ratio(ours.median_steps_per_s(), theirs.median_steps_per_s())
        same = ours.weights() == theirs.weights() and len(ours.weights()) == 1
        rows.append(
            [
                name,
                _fmt(theirs.median_wall(), " s"),
                _fmt(ours.median_wall(), " s"),
                _fmt(wall),
                _fmt(theirs.median_steps_per_s(), "", 1),
                _fmt(ours.median_steps_per_s(), "", 1),
                _fmt(rate),
                f"{ours.hangs} / {ours.failures} of {len(ours.runs)}",
                f"{theirs.hangs} / {theirs.failures} of {len(theirs.runs)}",
                "yes" if same else "NO",
            ]
        )
    return rows


CLIENT_COLUMNS = (
    "client",
    "torchrun wall",
    "rtrain wall",
    "wall rtrain/torchrun",
    "torchrun steps/s",
    "rtrain steps/s",
    "steps/s rtrain/torchrun",
    "rtrain hangs / failures",
    "torchrun hangs / failures",
    "same weights",
)
CRASH_COLUMNS = ("client", "launcher", "recovered", "weights = no-crash run", "hangs", "failure")


def crash_cells(row: CrashRow) -> list[str]:
    return [
        row.client,
        row.launcher,
        f"{row.recovered} of {row.runs}",
        f"{row.same_weights} of {row.runs}",
        str(row.hangs),
        row.why,
    ]


def render(
    client_table: list[list[str]], crashes: list[CrashRow], command: str, runs: int, scale: int
) -> str:
    def markdown(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return lines + ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]

    lines = [
        MARK_BEGIN,
        "## Real clients (`scripts/bench_clients.py`)",
        "",
        f"`{command}` on {platform.node() or 'this machine'} ({os.cpu_count()} cores, "
        f"torch {torch.__version__}, Python {platform.python_version()}); "
        f"{runs} runs of each client under each launcher, alternating, each trained "
        f"{scale}x as long as in tests/clients. Wall: median, "
        "launcher start to exit. Steps/s: the client's own, on rank 0 (the Trainer's "
        "`train_steps_per_second` for the transformers one), median.",
        "",
        *markdown(CLIENT_COLUMNS, client_table),
        "",
        "A crash (rank 1 `os._exit(3)` mid-run, `--max-restarts=1`), resumed from the "
        "framework's own checkpoint:",
        "",
        *markdown(CRASH_COLUMNS, [crash_cells(r) for r in crashes]),
        MARK_END,
    ]
    return "\n".join(lines)


def _clients(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()] if text else list(CLIENTS)
    unknown = [n for n in names if n not in CLIENTS]
    if unknown or not names:
        print(
            f"bench_clients: unknown client {', '.join(unknown) or '(none)'}; "
            f"known: {', '.join(CLIENTS)}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return names


def print_tables(tallies: dict[str, dict[str, Tally]], crashes: list[CrashRow]) -> list[list[str]]:
    """The console's tables; the client rows, for the doc."""
    rows = client_rows(tallies)
    console = Console(width=200)
    tables: list[tuple[str, tuple[str, ...], list[list[str]]]] = [
        ("real clients: rtrain vs torchrun", CLIENT_COLUMNS, rows)
    ]
    if crashes:
        crash_rows = [crash_cells(c) for c in crashes]
        tables.append(
            ("a crash, resumed from the framework's checkpoint", CRASH_COLUMNS, crash_rows)
        )
    steps = {
        name: {launcher: [(r.results[0], r.load) for r in t.done] for launcher, t in by.items()}
        for name, by in tallies.items()
    }
    marked = step_rows(steps)
    if marked:
        tables.append(("first steps (rank 0): median [min-max] over runs", STEP_COLUMNS, marked))
    for title, columns, cells in tables:
        table = Table(title=escape(title))
        for column in columns:
            table.add_column(column)
        for row in cells:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
    for name, by in tallies.items():
        pairs = [
            (ours, theirs)
            for ours, theirs in zip(by["rtrain"].runs, by["torchrun"].runs, strict=False)
            if ours in by["rtrain"].done and theirs in by["torchrun"].done
        ]
        ratio = paired_ratios(
            [Tally([o]).median_steps_per_s() or 0.0 for o, _ in pairs],
            [Tally([t]).median_steps_per_s() or 0.0 for _, t in pairs],
        )
        console.print(f"{name}: steps/s rtrain/torchrun, pair by pair: {ratio}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--crash-runs", type=int, default=3, help="0: no crash cases")
    parser.add_argument(
        "--scale", type=int, default=3, help="train each client this many times longer"
    )
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument(
        "--clients", default="", help=f"comma-separated, of: {', '.join(CLIENTS)} (default: all)"
    )
    parser.add_argument(
        "--doc", default=None, help="default: docs/benchmarks.md after a full run, else none"
    )
    args = parser.parse_args()
    names = _clients(args.clients)
    command = "python scripts/bench_clients.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="bench_clients_") as tmp:
        tallies = measure_clients(args.runs, args.timeout, Path(tmp), args.scale, names)
        crashes = measure_crashes(args.crash_runs, args.timeout, Path(tmp))
    rows = print_tables(tallies, crashes)
    full = names == list(CLIENTS) and args.crash_runs > 0
    doc = (
        args.doc if args.doc is not None else (str(ROOT / "docs" / "benchmarks.md") if full else "")
    )
    if doc:
        section = render(rows, crashes, command.strip(), args.runs, args.scale)
        write_doc(section, Path(doc), MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
