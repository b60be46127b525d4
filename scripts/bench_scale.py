#!/usr/bin/env python3
"""Coordination at scale: rtrain over TCPStore and over etcd, and torchrun, at N agents.

    scripts/bench_scale.py real [--nodes 8,16,32,64] [--backends c10d,etcd,torchrun]
    scripts/bench_scale.py sim  [--nodes 64,256,1024,2048] [--backends c10d,etcd] [--spares S]

real: N real agents on this machine (one trivial worker each, `--no-python sh`), per
backend in the same run. Figures: startup (the last agent started -> every worker
running); idle CPU per agent and the store host's CPU over a healthy window; etcd
requests per agent per second (etcd's own counters, every member); and for a silent
node loss (SIGSTOP of one node's agent and worker): detection (stop -> the first
survivor declares it lost) and commit (declared -> the survivors' next generation's
membership).

sim: the real protocol code (agent/rendezvous: Rounds, FailureLedger, the leases, the
fault policy) run by N simulated agents, up to 512 to a process, their checks and lease
renewals on one loop per process (sim_loop.py), against a real store server (a
TCPStore in a process of its own, or the etcd cluster): the same figures, store
requests and bytes per agent per second counted exactly at each agent's client, and
the simulator's own share (its processes' CPU, how late its loop ran a check).

Parts: bench_scale_real.py (real), bench_scale_sim.py with sim_shard.py, sim_loop.py
and sim_counting.py (sim), bench_scale_report.py (report). Results go to
docs/bench_scale.json (merged per part, with the load average before and after each
run) and are printed as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

OUT = ROOT / "docs" / "bench_scale.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["real", "sim", "report"])
    parser.add_argument("--nodes", default=None)
    parser.add_argument("--backends", default=None)
    parser.add_argument(
        "--spares", type=int, default=0, help="sim: hot spares beyond the N active agents"
    )
    args = parser.parse_args(argv)
    # SIGTERM ends the run through its finally blocks: agents and etcd members stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.part == "report":
        from bench_scale_report import report

        print(report(json.loads(OUT.read_text())))
        return 0
    if args.part == "real":
        from bench_scale_real import real

        args.nodes = [int(n) for n in (args.nodes or "8,16,32,64").split(",")]
        args.backends = (args.backends or "c10d,etcd,torchrun").split(",")
        results = real(args)
    else:
        from bench_scale_sim import simulate

        args.nodes = [int(n) for n in (args.nodes or "64,256,1024,2048").split(",")]
        args.backends = (args.backends or "c10d,etcd").split(",")
        results = simulate(args.nodes, args.backends, args.spares)
    merged = json.loads(OUT.read_text()) if OUT.exists() else {}
    today = time.strftime("%Y-%m-%d")
    fresh = {(r["backend"], r["nodes"], r.get("spares", 0)) for r in results}
    kept = [
        r
        for r in merged.get(args.part, [])
        if (r["backend"], r["nodes"], r.get("spares", 0)) not in fresh
    ]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    merged[args.part] = kept + [
        {**r, "measured": today, "load_average_at_end": load} for r in results
    ]
    merged[f"{args.part}_machine"] = (
        f"{os.cpu_count()} cores, {psutil.virtual_memory().total >> 30} GiB"
    )
    OUT.write_text(json.dumps(merged, indent=1) + "\n")
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
