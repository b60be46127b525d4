"""What the wall time by cause costs (core/observe/badput/).

The accounting never runs on a worker's step path: the agent recomputes its node's
split (live.node_split) at each event the accounting reads and at each metrics
sample (every 5 s), and `rtrain report` merges every node's once. This measures both:
a node's recompute against its generations so far, as a share of one CPU over the
5 s sampling period (what it can take from a step, at most, on a shared core), and
the report's merge for a large job.

    python scripts/bench_badput.py [--markdown]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rtrain.core.observe.badput.job import job_badput
from rtrain.core.observe.badput.live import node_split
from rtrain.core.observe.badput.node import LiveBeats
from rtrain.core.observe.events import Event

SAMPLE_S = 5.0  # agent/observe/metrics_file.py: at most one sample this often


def node_events(agent: str, generations: int) -> list[Event]:
    """A node's events through `generations` generations, each ended by a crash."""

    def ev(name: str, t: float, gen: int | None, **fields: Any) -> Event:
        return Event(name, t, agent, 0, gen, fields)

    events = [ev("agent_start", 0.0, None)]
    for gen in range(generations):
        t = 100.0 * gen + 10
        events += [
            ev("restore", t - 1, gen, seconds=0.5),
            ev("generation_start", t, gen, restored_step=None),
            ev("recovery", t + 5, gen, at_step=1, first_step=0),
            ev(
                "generation_end",
                t + 90,
                gen,
                outcome="local_failure",
                first_seen_t=t + 5,
                last_beat_t=t + 80,
            ),
            ev("fault", t + 90, gen, kind="hang" if gen % 2 else "exit", host=agent),
        ]
    return events


def best_of(runs: int, call: Any) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = []
    for generations in (1, 10, 100, 1000):
        events = node_events("10.0.0.1", generations)
        live = LiveBeats(events[-1].t + 20, events[-1].t + 60)
        seconds = best_of(20, lambda e=events, b=live: node_split(e, b))
        share = f"{seconds / SAMPLE_S:.4%}"
        rows.append((f"a node's split, {generations} generation(s)", seconds, share))
    for nodes, generations in ((128, 10), (1024, 10)):
        job = [
            e for n in range(nodes) for e in node_events(f"10.0.{n // 256}.{n % 256}", generations)
        ]
        end = max(e.t for e in job)
        seconds = best_of(3, lambda j=job, stop=end: job_badput(j, 0.0, stop))
        what = f"the report's merge, {nodes} nodes x {generations} generations"
        rows.append((what, seconds, "- (once, in `rtrain report`)"))
    if args.markdown:
        print("| what | time | share of one CPU over a 5 s sample |")
        print("|---|---|---|")
    for what, seconds, share in rows:
        if args.markdown:
            print(f"| {what} | {seconds * 1e3:.3f} ms | {share} |")
        else:
            print(f"{what}: {seconds * 1e3:.3f} ms ({share} of one CPU over a 5 s sample)")


if __name__ == "__main__":
    main()
