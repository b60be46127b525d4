"""Benchmark the state real frameworks hold, on real jobs under rtrain launch (gloo, CPU):

  overhead   a training step with and without keeping the state every step: DDP with
             snapshot() of Stateful objects, FSDP2 with snapshot() of DTensors and
             with dcp.save into rtrain's memory (SnapshotWriter); 2 workers, 1 node
  bytes      replication bytes per step with DP=2 over 2 nodes (DDP), replicas sent
             whole (--snapshot-dp-delta off) and against the DP twin (on)
  restore    FSDP2 on 3 nodes loses one: the 2 survivors reshard the last step from
             peers' memory through dcp.load (SnapshotReader), reading the shards their
             agents prefetched, then the same fetched on demand during the load, and
             load a disk copy of a step of the same size with DCP's FileSystemReader,
             its files evicted from the page cache; DCP's fixed cost (a load of the
             data position alone) apart; against one loopback TCP stream.
             --restore-only runs this alone and prints the table

The job is scripts/bench_state_worker.py. Results go to docs/benchmarks.md.

    python scripts/bench_state.py --sizes 100,1000

--free-core pins the workers to core 0 and leaves the other cores to the agent (the
replication's checksums): what a GPU node, with dozens of cores idle, gives it. The
per-step table also shows the time inside snapshot() or dcp.save against a plain
memory copy of the rank's state (the issue's bound: 1.2x).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
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
from bench_snapshot import loopback_seconds

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "scripts" / "bench_state_worker.py")
RTRAIN = [sys.executable, "-m", "rtrain.cli.main", "launch"]
MARK_BEGIN, MARK_END = "<!-- bench_state:begin -->", "<!-- bench_state:end -->"
SENT = re.compile(r"replication in generation 0: (\d+) replicas, ([0-9.]+) KiB sent of")
PREFETCHED = re.compile(r"prefetched \d+ of \d+ shards .* (\d+) from peers\) in ([0-9.]+)s")
FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=3", "--monitor-interval=0.1"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CORES: dict[str, str] = {}  # BENCH_CORES for the workers, with --free-core


def env_for(out: Path) -> dict[str, str]:
    return {
        **os.environ,
        **CORES,
        "BENCH_OUT": str(out),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }


def start_nodes(
    out: Path, nodes: int, nnodes: str, flags: list[str], args: list[str]
) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for index in range(nodes):
        cmd = [
            *RTRAIN,
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-conf=join_timeout=60,is_host={'true' if index == 0 else 'false'}",
            f"--local-addr=127.0.0.{index + 1}",
            "--rdzv-id=bench-state",
            *FAST,
            *flags,
            WORKER,
            *args,
        ]
        log = open(out / f"node{index}.log", "w")  # noqa: SIM115 - the node writes it
        procs.append(
            subprocess.Popen(cmd, env=env_for(out), stdout=log, stderr=subprocess.STDOUT, text=True)
        )
    return procs


def failed(out: Path, what: str) -> SystemExit:
    return SystemExit(f"{what}:\n{(out / 'node0.log').read_text()[-3000:]}")


def step_times(mode: str, keep: str, state_mb: int, steps: int) -> dict[str, float]:
    """The medians (seconds) of a 1-node, 2-worker job's step, of the time inside
    snapshot() or dcp.save, and of a plain copy of rank 0's state."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        procs = start_nodes(
            out,
            1,
            "1",
            ["--nproc-per-node=2"],
            [
                "--mode",
                mode,
                "--kept-with",
                keep,
                "--state-mb",
                str(state_mb),
                "--steps",
                str(steps),
            ],
        )
        code = procs[0].wait(timeout=1800)
        if code != 0:
            raise SystemExit(
                f"{mode}/{keep}/{state_mb} MB failed:\n{(out / 'node0.log').read_text()[-3000:]}"
            )
        found = json.loads((out / "steps.json").read_text())
        return {key: statistics.median(found[key]) for key in ("times", "inside", "copy")}


def replication_bytes(delta: str, state_mb: int, steps: int) -> float:
    """KiB sent per replica from node 0 of a DP=2 job over 2 nodes."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        procs = start_nodes(
            out,
            2,
            "2",
            ["--nproc-per-node=1", f"--snapshot-dp-delta={delta}"],
            ["--kept-with", "snapshot", "--state-mb", str(state_mb), "--steps", str(steps)],
        )
        codes = [p.wait(timeout=1800) for p in procs]
        log = (out / "node0.log").read_text()
        found = SENT.search(log)
        if codes != [0, 0] or found is None:
            raise SystemExit(f"replication run failed ({codes}):\n{log[-3000:]}")
        return float(found[2]) / int(found[1])


def resharding_restore(state_mb: int, keep: str = "") -> dict[str, Any]:
    """FSDP2 over 3 nodes, node 2 killed; the survivors' load times. keep: a folder to
    leave the nodes' logs in."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(keep or folder)
        out.mkdir(parents=True, exist_ok=True)
        disk = out / "disk"
        procs = start_nodes(
            out,
            3,
            "2:3",
            ["--nproc-per-node=1"],
            [
                "--mode",
                "fsdp2",
                "--kept-with",
                "dcp",
                "--state-mb",
                str(state_mb),
                "--steps",
                "12",
                "--disk",
                str(disk),
                "--disk-step",
                "3",
            ],
        )
        deadline = time.monotonic() + 900
        while not (out / "progress").exists() or int((out / "progress").read_text() or 0) < 6:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(
                    f"never reached step 6:\n{(out / 'node0.log').read_text()[-3000:]}"
                )
            time.sleep(0.1)
        for pid in _tree(procs[2].pid):
            os.kill(pid, signal.SIGKILL)
        codes = [p.wait(timeout=900) for p in procs[:2]]
        found = out / "restore.json"
        if codes != [0, 0] or not found.exists():
            raise SystemExit(
                f"restore run failed ({codes}):\n{(out / 'node0.log').read_text()[-3000:]}"
            )
        result = json.loads(found.read_text())
        logs = [(out / f"node{i}.log").read_text() for i in range(2)]
        fetches = [PREFETCHED.findall(log) for log in logs]
        result["prefetch_s"] = [float(f[-1][1]) for f in fetches if f]
        result["prefetch_fetched"] = [int(f[-1][0]) for f in fetches if f]
        return result


def restore_rows(state_mb: int, restore: dict, loopback: float | None) -> list[str]:
    """The resharding restore's table: dcp.load alone (and with set_state_dict) from
    peers' memory, prefetched and on demand, and from the evicted disk; DCP's fixed
    cost (a tiny load) apart, and the ratios with and without it."""
    per_rank = state_mb / restore["world"] * 2**20
    fixed_memory, fixed_disk = restore["tiny_memory_dcp_load"], restore["tiny_disk_dcp_load"]
    disk = restore["disk_dcp_load"]
    prefetch = ", ".join(f"{s:.3f} s" for s in restore.get("prefetch_s", [])) or "none"
    rows = [
        f"| FSDP2, 3 nodes -> 2, {state_mb} MB of state | dcp.load (with set_state_dict) | "
        "disk's time / this (target >= 5x) | the same less DCP's fixed cost |",
        "|---|---|---|---|",
    ]
    for name, key in (
        ("from peers' memory, prefetched by the agents (SnapshotReader)", "memory"),
        ("from peers' memory, fetched on demand during the load (before)", "memory_on_demand"),
        ("from disk (FileSystemReader, page cache evicted)", "disk"),
    ):
        load = restore[f"{key}_dcp_load"]
        fixed = fixed_disk if key == "disk" else fixed_memory
        ratio = "" if key == "disk" else f"{disk / load:.1f}x"
        bytes_only = (
            "" if key == "disk" else f"{(disk - fixed_disk) / max(load - fixed, 1e-3):.1f}x"
        )
        rows.append(f"| {name} | {load:.3f} s ({restore[key]:.3f} s) | {ratio} | {bytes_only} |")
    rows += [
        f"| DCP's fixed cost: a load of the data position alone | memory {fixed_memory:.3f} s, "
        f"disk {fixed_disk:.3f} s | | |",
        "",
        f"The agents' prefetch, beside their workers' start (per survivor): {prefetch}; "
        f"{restore['prefetched_files']} prefetched files on node 0.",
    ]
    if loopback is not None:
        rate = per_rank / restore["memory_dcp_load"]
        rows.append(
            f"Per-rank rate of the prefetched load: {rate / 2**20:.0f} MiB/s against one "
            f"loopback stream's {loopback / 2**20:.0f} MiB/s ({rate / loopback:.2f})."
        )
    return rows


def _tree(pid: int) -> list[int]:
    import psutil

    root = psutil.Process(pid)
    return [pid, *(p.pid for p in root.children(recursive=True))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="MB of state per job")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--restore-mb", type=int, default=600)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--free-core", action="store_true", help="workers on core 0 only")
    parser.add_argument("--skip-restore", action="store_true", help="per-step figures only")
    parser.add_argument(
        "--restore-only", action="store_true", help="the resharding restore alone, printed"
    )
    parser.add_argument("--keep", default="", help="leave the restore run's logs in this folder")
    args = parser.parse_args()
    if args.free_core:
        CORES["BENCH_CORES"] = "0"
    console = Console()
    if args.restore_only:
        restore = resharding_restore(args.restore_mb, args.keep)
        console.print(f"restore: {restore}")
        console.print("\n".join(restore_rows(args.restore_mb, restore, None)))
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    overhead = []
    for size in sizes:
        for mode, keeps in (("ddp", ("snapshot",)), ("fsdp2", ("snapshot", "dcp"))):
            base = step_times(mode, "none", size, args.steps)["times"]
            for keep in keeps:
                got = step_times(mode, keep, size, args.steps)
                kept, inside, copy = got["times"], got["inside"], got["copy"]
                overhead.append((size, mode, keep, base, kept, inside, copy))
                console.print(
                    f"{mode} {size} MB {keep}: {base:.3f} s -> {kept:.3f} s; inside "
                    f"{inside * 1e3:.1f} ms vs a copy {copy * 1e3:.1f} ms ({inside / copy:.2f}x)"
                )
    if args.skip_restore:
        for row in overhead:
            size, mode, keep, base, kept, inside, copy = row
            console.print(
                f"| {size} MB | {mode} | {keep} | {base:.3f} s | {kept:.3f} s | "
                f"{kept / base - 1:+.1%} | {inside * 1e3:.1f} ms | {copy * 1e3:.1f} ms | "
                f"{inside / copy:.2f} |"
            )
        return
    whole = replication_bytes("off", 100, args.steps)
    delta = replication_bytes("on", 100, args.steps)
    console.print(f"replication: {whole:.0f} KiB -> {delta:.1f} KiB per replica")
    restore = resharding_restore(args.restore_mb)
    console.print(f"restore: {restore}")
    per_rank = args.restore_mb / restore["world"] * 2**20
    loopback = per_rank / loopback_seconds(int(per_rank), 3)

    table = Table(title="state in rtrain's memory")
    lines = [
        "<!-- bench_state:begin -->",
        "## Framework state: per-step cost, DP twins, resharding restore "
        "(`scripts/bench_state.py`)",
        "",
        f"Command: `python scripts/bench_state.py --sizes {args.sizes} --steps {args.steps} "
        f"--restore-mb {args.restore_mb}{' --free-core' if args.free_core else ''}`",
        "",
        "| state per job (2 ranks) | framework | kept with | step without | step with | "
        "overhead (share of the step; target <= 3% at 1 GB) | inside snapshot()/dcp.save "
        "| a plain copy | ratio (target <= 1.2) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for column in ("state", "framework", "kept with", "step", "with", "overhead"):
        table.add_column(column)
    for size, mode, keep, base, kept, inside, copy in overhead:
        share = kept / base - 1
        row = [f"{size} MB", mode, keep, f"{base:.3f} s", f"{kept:.3f} s", f"{share:+.1%}"]
        table.add_row(*row)
        cost = [f"{inside * 1e3:.1f} ms", f"{copy * 1e3:.1f} ms", f"{inside / copy:.2f}"]
        lines.append("| " + " | ".join(row + cost) + " |")
    saved = 1 - delta / whole
    lines += [
        "",
        "| DDP, DP=2 over 2 nodes, 100 MB per rank | per step sent | target |",
        "|---|---|---|",
        f"| whole shards (`--snapshot-dp-delta off`) | {whole / 1024:.1f} MiB | |",
        f"| against the DP twin (`on`) | {delta:.1f} KiB ({saved:.2%} less) | >= 90% less |",
        "",
        *restore_rows(args.restore_mb, restore, loopback),
        "<!-- bench_state:end -->",
    ]
    console.print(table)
    write_doc("\n".join(lines), Path(args.doc), MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
