#!/usr/bin/env python3
"""A model of rtrain's control plane from 64 to 12,500 nodes (100k ranks of 8), built from
the per-request costs bench_scale.py sim measured; every assumption is a named constant
below, with where its value came from.

    scripts/model_control_plane.py [--png docs/images/control_plane_model.png] [--json]

For each backend (TCPStore, etcd) and for the next tier sketched for TCPStore (rack
aggregators), at each size: store requests per second, bytes a generation change moves
out of the store, time to detect a silent loss and to commit the next generation, and
the store host's CPU (cores busy). Prints a Markdown table and writes the plot.

The model, per size N:
  requests/s      = N x REQ_PER_AGENT_S (flat per agent: measured flat from 64 to 2,048)
  store CPU       = requests/s x CPU_PER_REQUEST (+ the commit's burst, below)
  bytes/gen       = N x (JOIN_BYTES + N x MEMBER_BYTES): every agent reads the whole
                    compressed membership once
  detect          = lease timeout + what the runs measured past it; once the store
                    saturates its backlog grows and renewals queue past the timeout
  commit          = COMMIT_BASE + N x JOIN_REQUESTS x CPU_PER_REQUEST / store threads
                    + bytes/gen / STORE_BANDWIDTH (+ etcd: the join counter's contention)
A store saturates when its busy cores reach its usable cores: TCPStore's server is one
thread (libuv's loop), so one core whatever the host; etcd's members use every core.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 12500]
LEASE_TIMEOUT_S = 5.0  # --heartbeat-timeout, as the benchmarks ran
STORE_BANDWIDTH = 1.25e9  # bytes/s out of one store host: a 10 Gb/s NIC (assumed)
RACK = 32  # nodes per rack aggregator, the next tier (assumed)


@dataclass(frozen=True)
class Backend:
    name: str
    req_per_agent_s: float  # steady state, every agent, counted at the client
    cpu_per_request_s: float  # store-side CPU (all members, for etcd) per request
    usable_cores: float  # cores the store can use before it saturates
    join_requests: float  # store requests one agent's rejoin makes
    join_bytes: float  # bytes one agent's rejoin moves besides the membership
    member_bytes: float  # bytes of compressed membership per member
    commit_base_s: float  # commit at 64 nodes, measured
    counter_rtt_s: float  # etcd: a contended add's read + compare-and-set, per joiner
    detect_extra_s: float  # detection past the lease timeout, measured at 64-2,048


# TCPStore, bench_scale.py sim (2026-12-03, 2 cores shared with other runs, load
# average 20-34, each row's in docs/bench_scale.json): 3.33, 3.31, 3.33 and 3.30
# requests per agent per second at 64, 256, 1,024 and 2,048 agents; the server's CPU
# 0.5 % at 213 req/s, 2.0 % at 847, 11.2 % at 3,410, 20.2 % at 6,758: 23-33 us a
# request, 30 us taken. Bytes per generation 0.115, 0.84, 9.5 and 37.7 MB: about
# 1.1 KB + 8.9 B x N per agent (each reads the compressed membership). Commit 0.58 s
# at 64. A rejoin: about 10 requests (the round, the closed key, the add, the slot,
# the closed key's wait and check, the membership, the lost list, the abort record).
TCPSTORE = Backend("TCPStore", 3.32, 30e-6, 1.0, 10, 1100, 8.9, 0.58, 0.0, 0.3)
# etcd (3 members on the same 2 cores), bench_scale.py sim after the one-stream watch
# and the sequence-key counter: 1.21 requests per agent per second at 64 (keep-alive
# 1.0, the sweep's gets and the stream's reads 0.21), 1.58 at 256 (where the
# simulator fell behind); the members' CPU 11.5 % at 77 req/s and 35 % at 404: 0.9-1.5
# ms of CPU a request over the JSON gateway, all members together, 1 ms taken. Bytes
# per generation 0.81 MB at 64, 2.0 MB at 256 (JSON and base64). Commit 3.7 s at 64.
# A joiner's increment is now one put (no contention), but its raise and a few
# stragglers' compare-and-sets remain: 1 ms of serialised time each (assumed). Members
# assumed on hosts of 16 usable cores (etcd uses them all; TCPStore's server one).
ETCD = Backend("etcd", 1.21, 1.0e-3, 16.0, 12, 8000, 11.3, 3.7, 1e-3, 0.6)


@dataclass(frozen=True)
class Point:
    backend: str
    nodes: int
    requests_s: float
    bytes_per_generation: float
    detect_s: float
    commit_s: float
    store_cores: float
    saturated: bool


def point(backend: Backend, nodes: int, aggregated_by: int = 1) -> Point:
    """The model at one size; aggregated_by > 1: the rack tier (one aggregator per
    aggregated_by nodes talks to the store, and serves its rack the membership)."""
    talkers = max(1, nodes // aggregated_by)
    requests_s = talkers * backend.req_per_agent_s
    busy = requests_s * backend.cpu_per_request_s
    saturated = busy >= backend.usable_cores
    membership = nodes * backend.member_bytes
    moved = talkers * (backend.join_bytes + membership)
    # the commit's own work is serialised on the store's threads (one for TCPStore)
    join_work = talkers * backend.join_requests * backend.cpu_per_request_s
    threads = backend.usable_cores
    commit = (
        backend.commit_base_s
        + join_work / threads
        + moved / STORE_BANDWIDTH
        + talkers * backend.counter_rtt_s
    )
    if aggregated_by > 1:  # the aggregator hands its rack the membership, and a hop each way
        commit += aggregated_by * membership / STORE_BANDWIDTH + 0.05
    detect = LEASE_TIMEOUT_S + backend.detect_extra_s
    if saturated:  # the backlog grows: renewals queue past the timeout (false losses)
        detect = float("nan")
        commit *= busy / backend.usable_cores
    return Point(
        backend.name if aggregated_by == 1 else f"{backend.name} + rack tier",
        nodes,
        requests_s,
        moved,
        detect,
        commit,
        busy,
        saturated,
    )


def model() -> list[Point]:
    points = []
    for backend in (TCPSTORE, ETCD):
        points += [point(backend, n) for n in SIZES]
    points += [point(TCPSTORE, n, RACK) for n in SIZES]
    return points


def saturation(backend: Backend) -> int:
    """The node count at which the store's busy cores reach its usable cores."""
    return int(backend.usable_cores / (backend.req_per_agent_s * backend.cpu_per_request_s))


def table(points: list[Point]) -> str:
    lines = [
        "| backend | nodes | requests/s at the store | bytes per generation | detect | commit "
        "| store cores busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        flag = " (saturated)" if p.saturated else ""
        lines.append(
            f"| {p.backend} | {p.nodes:,} | {p.requests_s:,.0f} | "
            f"{p.bytes_per_generation / 1e6:,.1f} MB | "
            f"{'unbounded' if p.saturated else f'{p.detect_s:.1f} s'} | {p.commit_s:.2f} s | "
            f"{p.store_cores:.2f}{flag} |"
        )
    return "\n".join(lines)


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [
        ("requests_s", "store requests / s"),
        ("bytes_per_generation", "bytes out of the store per generation"),
        ("commit_s", "commit after the loss is declared (s)"),
        ("store_cores", "store host cores busy"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    names = sorted({p.backend for p in points})
    for ax, (field, label) in zip(axes.flat, figures, strict=True):
        for name in names:
            mine = [p for p in points if p.backend == name]
            ax.plot([p.nodes for p in mine], [getattr(p, field) for p in mine], "o-", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    measured = _measured()
    for name, marker in (("c10d", "x"), ("etcd", "+")):
        runs = [r for r in measured if r.get("backend") == name and "commit_after_declared_s" in r]
        axes[1][0].scatter(
            [r["nodes"] for r in runs],
            [r["commit_after_declared_s"] for r in runs],
            marker=marker,
            color="black",
            label=f"measured, sim ({name})",
        )
    axes[1][0].legend(fontsize=8)
    axes[1][0].axhline(3.0, color="grey", linestyle="--", linewidth=1)
    axes[1][1].axhline(TCPSTORE.usable_cores, color="grey", linestyle="--", linewidth=1)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("rtrain's control plane, modelled from measured per-request costs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def _measured() -> list[dict[str, object]]:
    """bench_scale.py sim's rows, as docs/bench_scale.json keeps them (none: [])."""
    try:
        rows = json.loads((ROOT / "docs" / "bench_scale.json").read_text()).get("sim", [])
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", default=str(ROOT / "docs" / "images" / "control_plane_model.png"))
    parser.add_argument("--json", action="store_true", help="the points as JSON, no plot")
    args = parser.parse_args(argv)
    points = model()
    if args.json:
        print(json.dumps([p.__dict__ for p in points], indent=1))
        return 0
    print(table(points))
    for backend in (TCPSTORE, ETCD):
        print(f"{backend.name}: one store saturates at about {saturation(backend):,} nodes")
    plot(points, Path(args.png))
    print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
