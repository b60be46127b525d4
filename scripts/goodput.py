#!/usr/bin/env python3
"""Goodput against cluster size: rtrain's in-job recovery against torchrun with disk
checkpoints, from Llama 3's failure rate and the figures rtrain measured.

    scripts/goodput.py [--scale docs/bench_scale.json] [--png docs/goodput.png]

Goodput is the fraction of GPU time that trains: 1 - (time lost per interruption x
interruptions per hour) - (time spent writing checkpoints per hour). Every assumption
is a field of Assumptions below, with where its number comes from; docs/benchmarks.md
lists them too. Prints a table and writes a PNG (matplotlib, `pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Assumptions:
    # Llama 3 (Dubey et al. 2024): 419 unexpected interruptions in 54 days on 16,384
    # GPUs; the rate is taken as proportional to the number of GPUs.
    interruptions: int = 419
    days: float = 54.0
    gpus_observed: int = 16384
    gpus_per_node: int = 8
    # Both: a job step of this long (a large dense model at this scale).
    step_s: float = 10.0
    # torchrun: a failure is found when the crashed rank's peers time out in NCCL or a
    # hang trips the watchdog; torch's default NCCL timeout is 10 min, most crashes
    # end the process at once: assume 2 min on average.
    torchrun_detect_s: float = 120.0
    # torchrun: every process of the job restarts: the scheduler requeues (or
    # --max-restarts restarts every agent), Python and CUDA start, NCCL initialises at
    # full scale. MegaScale (NSDI'24) measured 1,047 s with TCPStore at 2,048 GPUs
    # before its fix and under 30 s after; assume 5 min + 20 ms per GPU.
    torchrun_restart_s: float = 300.0
    torchrun_restart_per_gpu_s: float = 0.02
    # torchrun: the checkpoint is read back from shared storage (state of a 400B-class
    # model with optimizer, 16 bytes per parameter, read at an aggregate 200 GB/s).
    state_bytes: float = 405e9 * 16
    storage_read_bytes_s: float = 200e9
    # torchrun: a checkpoint every 30 min; half an interval is lost on average; each
    # write stalls training this long (asynchronous DCP saves keep it short).
    checkpoint_every_s: float = 1800.0
    checkpoint_stall_s: float = 30.0
    # rtrain: a lost node is declared after its lease lapses (measured: detect_s) and
    # the survivors commit the next generation (measured at scale: commit_after_declared_s).
    rtrain_detect_s: float = 5.3
    rtrain_commit_s: float = 2.0
    # rtrain: the restarted workers' own start (fork from the preloaded pool, NCCL
    # init of the new world): measured 0.17 s on CPU/gloo; assume 60 s at 16k GPUs.
    rtrain_worker_start_s: float = 60.0
    # rtrain: each worker restores its shard from a peer's host memory at network
    # speed (measured 0.9 GB/s over loopback; assume 10 GB/s per GPU on the fabric).
    restore_bytes_s_per_gpu: float = 10e9
    # rtrain: snapshots every step, so one step is lost; a failure that takes every
    # copy of some shard (correlated, e.g. a rack) falls back to the disk checkpoint.
    rtrain_lost_steps: float = 1.0
    copies_lost_fraction: float = 0.02

    def interruptions_per_hour(self, gpus: int) -> float:
        per_gpu_hour = self.interruptions / (self.days * 24 * self.gpus_observed)
        return per_gpu_hour * gpus


def torchrun_loss_s(a: Assumptions, gpus: int) -> float:
    restart = a.torchrun_restart_s + a.torchrun_restart_per_gpu_s * gpus
    reload = a.state_bytes / a.storage_read_bytes_s
    return a.torchrun_detect_s + restart + reload + a.checkpoint_every_s / 2


def rtrain_loss_s(a: Assumptions, gpus: int) -> float:
    restore = a.state_bytes / gpus / a.restore_bytes_s_per_gpu
    in_memory = (
        a.rtrain_detect_s + a.rtrain_commit_s + a.rtrain_worker_start_s + restore
        + a.rtrain_lost_steps * a.step_s
    )  # fmt: skip
    return (1 - a.copies_lost_fraction) * in_memory + a.copies_lost_fraction * torchrun_loss_s(
        a, gpus
    )


def goodput(a: Assumptions, gpus: int, loss_s: float, stall_per_hour_s: float) -> float:
    lost_per_hour = a.interruptions_per_hour(gpus) * loss_s + stall_per_hour_s
    return max(0.0, 1.0 - lost_per_hour / 3600.0)


def figures(a: Assumptions, sizes: list[int]) -> list[dict[str, float]]:
    rows = []
    stall = a.checkpoint_stall_s * 3600 / a.checkpoint_every_s
    for gpus in sizes:
        rows.append(
            {
                "gpus": gpus,
                "mtbf_h": 1 / a.interruptions_per_hour(gpus),
                "torchrun_loss_s": torchrun_loss_s(a, gpus),
                "rtrain_loss_s": rtrain_loss_s(a, gpus),
                "torchrun_goodput": goodput(a, gpus, torchrun_loss_s(a, gpus), stall),
                # rtrain keeps the disk checkpoint as the last resort: its stall too
                "rtrain_goodput": goodput(a, gpus, rtrain_loss_s(a, gpus), stall),
            }
        )
    return rows


def from_scale(a: Assumptions, scale: Path) -> Assumptions:
    """Take detection and commit time from bench_scale.py's results where present: the
    largest simulated run's commit (else the worst commit of the largest real runs),
    the real runs' worst detection."""
    if not scale.exists():
        return a
    data = json.loads(scale.read_text())
    sims = [r for r in data.get("sim", []) if "commit_after_declared_s" in r]
    reals = [
        r
        for r in data.get("real", [])
        if "commit_after_declared_s" in r and r["backend"] != "torchrun"
    ]
    values = asdict(a)
    if sims:
        values["rtrain_commit_s"] = max(sims, key=lambda r: r["nodes"])["commit_after_declared_s"]
    elif reals:
        largest = max(r["nodes"] for r in reals)
        values["rtrain_commit_s"] = max(
            r["commit_after_declared_s"] for r in reals if r["nodes"] == largest
        )
    if reals:
        values["rtrain_detect_s"] = max(r["detect_s"] for r in reals)
    return Assumptions(**values)


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r["gpus"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(gpus, [100 * r["rtrain_goodput"] for r in rows], "o-", label="rtrain (in-job, memory)")
    ax.plot(
        gpus, [100 * r["torchrun_goodput"] for r in rows], "s-", label="torchrun + disk, 30 min"
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("goodput (% of GPU time that trains)")
    ax.set_title("Goodput at Llama 3's failure rate (419 interruptions / 54 days / 16k GPUs)")
    ax.axvline(16384, color="grey", linestyle=":", linewidth=1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default=str(ROOT / "docs" / "bench_scale.json"))
    parser.add_argument("--png", default=str(ROOT / "docs" / "goodput.png"))
    args = parser.parse_args(argv)
    a = from_scale(Assumptions(), Path(args.scale))
    sizes = [1024 * 2**k for k in range(7)]  # 1k .. 64k GPUs
    rows = figures(a, sizes)
    print("| GPUs | MTBF | torchrun: lost per interruption | rtrain | torchrun goodput | "
          "rtrain goodput |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['gpus']:,} | {r['mtbf_h']:.2f} h | {r['torchrun_loss_s'] / 60:.1f} min | "
            f"{r['rtrain_loss_s'] / 60:.1f} min | {100 * r['torchrun_goodput']:.1f} % | "
            f"{100 * r['rtrain_goodput']:.1f} % |"
        )
    print("\nassumptions: " + json.dumps(asdict(a)))
    try:
        plot(rows, Path(args.png))
        print(f"wrote {args.png}")
    except ImportError:
        print("no matplotlib: no PNG (pip install matplotlib)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
