"""Schedules: 1F1B, 1F1B with decoupled B/W, ReCycle's adaptive schedule, and the
drop-the-replicas baseline, all made by one greedy list scheduler.

The scheduler runs the iteration in simulated time. Whenever a worker is free it
starts the best op whose inputs are there, by the schedule's priorities; a forward
only while the worker holds fewer micro-batches than its cap:

| schedule  | who runs what             | priorities               | F cap        | optimizer |
|-----------|---------------------------|--------------------------|--------------|-----------|
| 1f1b      | own work                  | W right after B, B, F    | min(L, P-s)  | synced    |
| decoupled | own work                  | B, F, W (W fills gaps)   | min(L, P-s)  | synced    |
| recycle   | re-routed (pipeline_plan) | B, F, W                  | L            | staggered |
| drop      | failed replicas' work     | as 1f1b                  | min(L, P-s)  | synced    |
|           | moved whole to survivors  |                          |              |           |

P-s is what 1F1B keeps in flight at stage s; L is the memory limit. Without failures
ReCycle runs plain 1F1B (there is nothing to re-route), so its fault-free iteration
time is 1F1B's by construction. Every plan goes through the simulator's checks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from rtrain.core.pipeline_job import PipelineJob, Worker
from rtrain.core.pipeline_plan import (
    Graph,
    Op,
    Plan,
    build_graph,
    check_failures,
    drop_replicas,
    normalize,
    reroute,
    survivors,
)
from rtrain.core.pipeline_sim import simulate

SCHEDULES = ("1f1b", "decoupled", "recycle", "drop")
FUSED = {"W": 0, "OPT": 0, "B": 1, "F": 2}
DECOUPLED = {"OPT": 0, "B": 1, "F": 2, "W": 3}
W_FIRST = {"OPT": 0, "B": 1, "W": 2, "F": 3}
PORTFOLIO_OPS = 20000
INF = float("inf")


def _memory_cap(job: PipelineJob, w: Worker) -> int:
    return job.memory


def _pipeline_cap(job: PipelineJob, w: Worker) -> int:
    return min(job.memory, job.pp - w[1] + 1)


RECYCLE_VARIANTS = (
    (DECOUPLED, _memory_cap),
    (W_FIRST, _memory_cap),
    (DECOUPLED, _pipeline_cap),
    (FUSED, _memory_cap),
)


def plan(
    job: PipelineJob,
    failed: Iterable[Worker] = (),
    schedule: str = "recycle",
    iterations: int = 2,
) -> Plan:
    """The plan of `schedule` for this failure set (physical workers)."""
    lost = check_failures(job, failed)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    if schedule in ("1f1b", "decoupled") and lost:
        raise ValueError(f"{schedule} is the fault-free reference: it takes no failures")
    # Nothing to re-route: ReCycle is 1F1B.
    schedule_used = "1f1b" if schedule == "recycle" and not lost else schedule
    mapping: dict[Worker, Worker] = {}
    if schedule == "recycle" and lost:
        canonical, mapping = normalize(job, lost)
        assignment = reroute(job, canonical)
        workers = survivors(job, canonical)
    elif schedule == "drop":
        assignment = drop_replicas(job, lost)
        broken = {r for r, _ in lost}
        workers = [(r, s) for r in range(job.dp) if r not in broken for s in range(job.pp)]
    else:
        assignment = {
            (r, m, s): (r, s)
            for r in range(job.dp)
            for m in range(job.microbatches)
            for s in range(job.pp)
        }
        workers = survivors(job, frozenset())
    staggered = schedule_used == "recycle"
    graph = build_graph(job, assignment, workers, iterations, staggered)
    if schedule_used != "recycle":
        priorities = FUSED if schedule_used in ("1f1b", "drop") else DECOUPLED
        caps = {w: min(job.memory, job.pp - w[1]) for w in workers}
        orders = list_schedule(job, graph, workers, priorities, caps)
        return Plan(job, lost, schedule, staggered, iterations, assignment, orders, mapping)
    # ReCycle: a few priority rules and forward caps; the best simulated one wins (one
    # rule only for big jobs, where planning time matters more).
    variants = RECYCLE_VARIANTS if len(graph.worker) <= PORTFOLIO_OPS else RECYCLE_VARIANTS[:1]
    best: tuple[float, Plan] | None = None
    for priorities, cap_of in variants:
        caps = {w: cap_of(job, w) for w in workers}
        orders = list_schedule(job, graph, workers, priorities, caps)
        candidate = Plan(job, lost, schedule, staggered, iterations, assignment, orders, mapping)
        if len(variants) == 1:
            return candidate
        took = simulate(candidate).iteration_time
        if best is None or took < best[0]:
            best = (took, candidate)
    assert best is not None
    return best[1]


def list_schedule(
    job: PipelineJob,
    graph: Graph,
    workers: list[Worker],
    priorities: dict[str, int],
    caps: dict[Worker, int],
) -> dict[Worker, list[Op]]:
    """Greedy: each free worker starts its best available op (see the module doc)."""
    waiting = {op: len(p) for op, p in graph.preds.items()}
    arrival = dict.fromkeys(graph.worker, 0.0)  # when an op's last input is there
    orders: dict[Worker, list[Op]] = {w: [] for w in workers}
    free_at = dict.fromkeys(workers, 0.0)
    live = dict.fromkeys(workers, 0)
    pending: dict[Worker, list[tuple[float, int, Op]]] = {w: [] for w in workers}
    available: dict[Worker, list[tuple[tuple, int, Op]]] = {w: [] for w in workers}
    events: list[tuple[float, int, Worker]] = []
    wake = dict.fromkeys(workers, INF)  # each worker's one pending event (others are stale)
    tick = itertools.count()
    where_of, succs, transfer = graph.worker, graph.succs, job.transfer
    push, pop = heapq.heappush, heapq.heappop

    def key(op: Op) -> tuple:
        return (priorities[op.kind], op.iteration, op.microbatch, op.replica)

    def finish(op: Op, at: float) -> None:
        """op ends at `at`: its successors learn when their inputs arrive."""
        source = where_of[op]
        for nxt in succs[op]:
            where = where_of[nxt]
            # Activations (F -> F) and gradients (B -> B) cross workers, nothing else.
            if transfer and where != source and nxt[0] == op[0] and where and source:
                ready = at + transfer
            else:
                ready = at
            if ready > arrival[nxt]:
                arrival[nxt] = ready
            waiting[nxt] -= 1
            if waiting[nxt]:
                continue
            if where is None:  # a barrier: instant
                finish(nxt, arrival[nxt])
                continue
            push(pending[where], (arrival[nxt], next(tick), nxt))
            free = free_at[where]
            at_ = arrival[nxt] if arrival[nxt] > free else free
            if at_ < wake[where]:
                wake[where] = at_
                push(events, (at_, next(tick), where))

    for op, n in waiting.items():
        if n == 0:
            where = graph.worker[op]
            if where is None:
                finish(op, 0.0)
            else:
                push(pending[where], (0.0, next(tick), op))
                if wake[where] > 0.0:
                    wake[where] = 0.0
                    push(events, (0.0, next(tick), where))

    while events:
        now, _, w = pop(events)
        if now != wake[w]:
            continue  # stale: superseded by an earlier event for this worker
        wake[w] = INF
        while pending[w] and pending[w][0][0] <= now:
            _, _, op = heapq.heappop(pending[w])
            heapq.heappush(available[w], (key(op), next(tick), op))
        chosen, skipped = None, []
        while available[w]:
            item = heapq.heappop(available[w])
            if item[2].kind == "F" and live[w] >= caps[w]:
                skipped.append(item)
                continue
            chosen = item[2]
            break
        for item in skipped:
            heapq.heappush(available[w], item)
        if chosen is None:
            if pending[w]:
                wake[w] = pending[w][0][0]
                heapq.heappush(events, (wake[w], next(tick), w))
            continue
        end = now + graph.duration[chosen]
        orders[w].append(chosen)
        free_at[w] = end
        live[w] += chosen.kind == "F"
        live[w] -= chosen.kind == "W"
        wake[w] = end  # before finish(): arrivals meanwhile need no event of their own
        heapq.heappush(events, (end, next(tick), w))
        finish(chosen, end)
    return orders
