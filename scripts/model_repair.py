#!/usr/bin/env python3
"""A model of fault -> the survivors' next completed step on GPU nodes: rtrain's process
restart on every node (as today) against repair in place (the survivors keep their
process, CUDA context, compiled modules and data loaders; only what failed is replaced,
and the communicator is rebuilt), from published figures.

    scripts/model_repair.py [--png docs/images/model_repair.png] [--gpus 1024,16384]
        [--through-png docs/images/model_through.png]

Three faults: a worker crashes on a healthy node (its replacement starts on the same
node); a node is lost and a hot standby takes its ranks (its workers started and warmed
up before the fault, as TrainMover's sandboxed warm-up and NVRx's hot spares do); a node
is lost with no standby and the world shrinks by one node. Every assumption is a field
of Assumptions with where its number comes from; docs/benchmarks.md lists them too.
Prints a table (rich) and writes a PNG (matplotlib). The train-through case (the survivors
go on at once in a smaller group; the replacement joins when warm) is in
scripts/model_through.py: a second table and PNG.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from rtrain.core.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {
    "crash": "worker crash, replaced on its node",
    "standby": "node lost, hot standby takes over",
    "shrink": "node lost, world shrinks",
}
PATHS = ("restart", "repair")


@dataclass(frozen=True)
class Assumptions:
    gpus_per_node: int = 8
    # Detection: a crashed worker's exit is seen at once (0.09 s measured,
    # docs/benchmarks.md, bench_recovery "worker crash"); a lost node when its lease
    # lapses (5.3 s, the worst real figure of bench_scale, as in scripts/goodput.py).
    detect_crash_s: float = 0.1
    detect_node_s: float = 5.3
    # The survivors commit the next generation: 2.0 s at scale (bench_scale's
    # simulation, scripts/goodput.py's rtrain_commit_s).
    commit_s: float = 2.0
    # A new worker process: forked from rtrain's warm pool, Python and torch already
    # imported: 0.17 s measured (bench_launch (b), crash -> next first collective).
    process_start_s: float = 0.17
    # CUDA context creation in a new process: "can, unfortunately, take this long"
    # (1-2 s, ezyang on pytorch/pytorch#39005); 4 s for CUDA init and a first tensor
    # (pytorch/pytorch#22583). A fork cannot carry it: every new process pays it.
    cuda_context_s: float = 2.0
    # NCCL communicator set-up over N ranks: stock NCCL takes about 265 s at 96k GPUs
    # (Meta, "Collective Communication for 100k+ GPUs", arXiv 2510.20171), i.e.
    # 2.76 ms a rank if linear, plus a 1 s floor (topology detection on the node).
    # MegaScale's figures after its fixes (under 5 s at 2,048 GPUs, under 30 s above
    # 10k; NSDI'24) lie near this line. Both paths rebuild the whole communicator here;
    # a delta set-up (TrainMover; ncclCommShrink in NCCL 2.27) would cut repair's.
    nccl_floor_s: float = 1.0
    nccl_per_rank_s: float = 265.0 / 96_000
    # Aborting the broken communicator on a survivor: NVRx's in-process restart measured
    # destroy_process_group at about 0.5 s (its docs; shared/REFERENCE.md section 9).
    abort_s: float = 0.5
    # Training state: Llama 3 405B with Adam, 16 bytes a parameter, fully sharded over
    # the job (as scripts/goodput.py). A restarted worker copies its shard from rtrain's
    # host-memory snapshot to the GPU at 25 GB/s (PCIe 5.0 x16 is 64 GB/s a direction;
    # our assumption: 40 % of it). A shrinking world fetches the lost node's shards from
    # peers' memory at 10 GB/s a GPU (scripts/goodput.py's assumption).
    state_bytes: float = 405e9 * 16
    h2d_bytes_s: float = 25e9
    peer_bytes_s: float = 10e9
    # torch.compile in a new process with its cache on the node's disk (warm): "on the
    # order of 30-40 seconds for a warm recompile" of a Llama-class model (Chillee,
    # pytorch-labs/gpt-fast#43). Cold would be 2-3x more (ResNet152: 21.1 s cold, 8.9 s
    # warm, thomasjpfan.com, 2025); every node here keeps its cache, so warm.
    compile_warm_s: float = 35.0
    # Data-loader workers and their first batch: a loader restarted each epoch cost
    # about 7 min over 50 epochs against 35 s with persistent workers
    # (open-mmlab/mmhuman3d#233), about 8 s a start.
    loader_start_s: float = 8.0
    # One training step of a large dense model at this scale (scripts/goodput.py).
    step_s: float = 10.0
    # Train through (scripts/model_through.py): the survivors drop the failed ranks from
    # their communicator. NCCL 2.27+ ncclCommShrink / torch 2.13's shrink_group do it
    # without a fresh init (shared/REFERENCE.md section 11); no time for it at scale is
    # published: ElasWave (2025) reports "communicator repair under 1 s" (scale not
    # stated), taken here as 1 s flat. Without a shrink, the group is created anew
    # (nccl_init_s above: what rtrain does today, a new group of the kept ranks).
    shrink_s: float = 1.0
    # While the replacement starts, one peer does the failed rank's data share as well
    # as its own: a compute-bound step then takes this many times as long (rtrain's
    # shares move whole logical ranks; spreading micro-batches over several peers, as
    # ReCycle does, would cut it).
    interim_step_factor: float = 2.0

    def nccl_init_s(self, ranks: int) -> float:
        return self.nccl_floor_s + self.nccl_per_rank_s * ranks


def phases(a: Assumptions, scenario: str, path: str, gpus: int) -> dict[str, float]:
    """Fault -> next completed step on the critical path, by phase, in seconds.

    Ranks start in parallel, so the critical path holds one rank's start: every rank's
    under restart, the replacement's under repair (the survivors wait for it). A hot
    standby's workers started before the fault: only the shard's copy to its GPU is left.
    """
    if scenario not in SCENARIOS or path not in PATHS:
        raise ValueError(f"unknown scenario or path: {scenario!r}, {path!r}")
    world = gpus - a.gpus_per_node if scenario == "shrink" else gpus
    shard = a.state_bytes / world
    out = {"detect": a.detect_crash_s if scenario == "crash" else a.detect_node_s}
    out["commit"] = a.commit_s
    cold_start = {
        "process": a.process_start_s,
        "CUDA context": a.cuda_context_s,
        "state to GPU": shard / a.h2d_bytes_s,
        "data loaders": a.loader_start_s,
        "compile": a.compile_warm_s,
    }
    if path == "restart":
        out.update(cold_start)
    else:
        out["abort"] = a.abort_s
        if scenario == "crash":
            out.update(cold_start)
        elif scenario == "standby":
            out["state to GPU"] = shard / a.h2d_bytes_s
    if scenario == "shrink":  # the lost node's shards, spread over the survivors
        lost = a.state_bytes / gpus * a.gpus_per_node
        out["reshard"] = lost / world / a.peer_bytes_s
    out["NCCL init"] = a.nccl_init_s(world)
    out["step"] = a.step_s
    return out


def figures(a: Assumptions, sizes: list[int]) -> list[dict]:
    rows = []
    for gpus in sizes:
        for scenario in SCENARIOS:
            totals = {p: sum(phases(a, scenario, p, gpus).values()) for p in PATHS}
            rows.append(
                {
                    "gpus": gpus,
                    "scenario": scenario,
                    "restart_s": totals["restart"],
                    "repair_s": totals["repair"],
                    "ratio": totals["repair"] / totals["restart"],
                    "restart": phases(a, scenario, "restart", gpus),
                    "repair": phases(a, scenario, "repair", gpus),
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fault -> the survivors' next completed step (model, seconds)")
    for column in ("GPUs", "fault", "process restart", "repair in place", "repair / restart"):
        table.add_column(column, justify="right" if column != "fault" else "left")
    for r in rows:
        table.add_row(
            f"{r['gpus']:,}",
            SCENARIOS[r["scenario"]],
            f"{r['restart_s']:.1f}",
            f"{r['repair_s']:.1f}",
            f"{r['ratio']:.2f}",
        )
    Console(width=110).print(table)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| GPUs | fault | process restart | repair in place | repair / restart |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['gpus']:,} | {SCENARIOS[r['scenario']]} | {r['restart_s']:.1f} s | "
        f"{r['repair_s']:.1f} s | {r['ratio']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


COLOURS = {
    "detect": "#9e9e9e",
    "commit": "#616161",
    "abort": "#795548",
    "process": "#ffcc80",
    "CUDA context": "#ef6c00",
    "state to GPU": "#42a5f5",
    "reshard": "#1565c0",
    "data loaders": "#ab47bc",
    "compile": "#e53935",
    "NCCL init": "#43a047",
    "step": "#cfd8dc",
}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["gpus"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.4), dpi=120, sharex=True)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, gpus in zip(axes, sizes, strict=True):
        bars = [(r, p) for r in rows if r["gpus"] == gpus for p in PATHS]
        labels = [f"{SCENARIOS[r['scenario']]}\n{p}" for r, p in bars]
        for y, (r, p) in enumerate(bars):
            left = 0.0
            for phase, seconds in r[p].items():
                ax.barh(y, seconds, left=left, color=COLOURS[phase], edgecolor="white", lw=0.5)
                left += seconds
            ax.text(left + 0.5, y, f"{left:.0f} s", va="center", fontsize=8)
        ax.set_yticks(range(len(bars)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{gpus:,} GPUs")
        ax.set_xlabel("seconds from the fault to the next completed step")
        ax.grid(True, axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, list(COLOURS), loc="lower center", ncol=len(COLOURS), fontsize=7)
    fig.suptitle("Process restart on every node against repair in place (model)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", default=str(ROOT / "docs" / "images" / "model_repair.png"))
    parser.add_argument("--gpus", default="1024,16384", help="job sizes, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    parser.add_argument(
        "--through-png", default=str(ROOT / "docs" / "images" / "model_through.png")
    )
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.gpus.split(",")]
    except ValueError:
        print(f"--gpus: not a list of integers: {args.gpus!r}", file=sys.stderr)
        return ExitCode.USAGE
    if any(s <= Assumptions().gpus_per_node for s in sizes):
        print("--gpus: every size must be more than one node (8 GPUs)", file=sys.stderr)
        return ExitCode.USAGE
    rows = figures(Assumptions(), sizes)
    print_table(rows)
    if args.markdown:
        print(markdown(rows))
    try:
        plot(rows, Path(args.png))
        print(f"wrote {args.png}")
    except ImportError:
        print("no matplotlib: no PNG (pip install matplotlib)", file=sys.stderr)
    import model_through

    model_through.report(Assumptions(), sizes, Path(args.through_png), args.markdown)
    return ExitCode.SUCCESS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
