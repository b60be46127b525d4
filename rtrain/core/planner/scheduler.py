"""Schedules: 1F1B, 1F1B with decoupled B/W, ReCycle's adaptive schedule, and the
drop-the-replicas baseline, all made by one greedy list scheduler.

The scheduler runs the iteration in simulated time. Whenever a worker is free it
starts the best op whose inputs are there, by the schedule's priorities; a forward
only while the worker holds fewer micro-batches than its cap:

| schedule  | who runs what             | priorities               | F cap        | optimizer |
|-----------|---------------------------|--------------------------|--------------|-----------|
| 1f1b      | own work                  | W right after B, B, F    | min(L, P-s)  | synced    |
| decoupled | own work                  | B, F, W (W fills gaps)   | min(L, P-s)  | synced    |
| recycle   | re-routed (plan.py)       | B, F, W                  | L            | staggered |
| drop      | failed replicas' work     | as 1f1b                  | min(L, P-s)  | synced    |
|           | moved whole to survivors  |                          |              |           |

P-s is what 1F1B keeps in flight at stage s; L is the memory limit. The scheduler runs
on index.py's integer-id graph (10^5 ops plan in about half a second). Without failures
ReCycle runs plain 1F1B (there is nothing to re-route): a choice, not a property. The
adaptive schedule itself (adaptive_plan) with nothing lost is often faster (W fills
the bubbles: 29 against 30 for a uniform 4-stage job) but not always (a stage with a
long W: 19 against 18.5), so 1F1B is the fault-free plan that never loses to it.
Every plan goes through the simulator's checks.
"""

from __future__ import annotations

import functools
import gc
import heapq
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from .index import KINDS, IndexedGraph, index_graph
from .index import F as F_KIND
from .index import W as W_KIND
from .job import PipelineJob, Worker
from .plan import (
    Op,
    Plan,
    check_failures,
    drop_replicas,
    normalize,
    reroute,
    survivors,
)
from .sim import simulate

SCHEDULES = ("1f1b", "decoupled", "recycle", "drop")
FUSED = {"W": 0, "OPT": 0, "B": 1, "F": 2}
DECOUPLED = {"OPT": 0, "B": 1, "F": 2, "W": 3}
W_FIRST = {"OPT": 0, "B": 1, "W": 2, "F": 3}
PORTFOLIO_OPS = 20000
INF = float("inf")
P = ParamSpec("P")
R = TypeVar("R")


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
        return adaptive_plan(job, lost, iterations)
    if schedule == "drop":
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
    graph = index_graph(job, assignment, workers, iterations, False)
    priorities = FUSED if schedule_used in ("1f1b", "drop") else DECOUPLED
    caps = {w: min(job.memory, job.pp - w[1]) for w in workers}
    orders = list_schedule(job, graph, workers, priorities, caps)
    return Plan(job, lost, schedule, False, iterations, assignment, orders, mapping)


def adaptive_plan(job: PipelineJob, lost: frozenset[Worker], iterations: int = 2) -> Plan:
    """ReCycle's adaptive schedule for these failed (physical) workers: the failure set
    normalized, work re-routed to the survivors, a staggered optimizer, and of a few
    priority rules and forward caps the best simulated one (one rule only for big jobs,
    where planning time matters more). plan() uses it only when something failed; with
    nothing lost it is the fault-free adaptive schedule."""
    canonical, mapping = normalize(job, lost) if lost else (frozenset(), {})
    assignment = reroute(job, canonical)
    workers = survivors(job, canonical)
    graph = index_graph(job, assignment, workers, iterations, True)
    variants = RECYCLE_VARIANTS if len(graph.kind) <= PORTFOLIO_OPS else RECYCLE_VARIANTS[:1]
    best: tuple[float, Plan] | None = None
    for priorities, cap_of in variants:
        caps = {w: cap_of(job, w) for w in workers}
        orders = list_schedule(job, graph, workers, priorities, caps)
        candidate = Plan(job, lost, "recycle", True, iterations, assignment, orders, mapping)
        if len(variants) == 1:
            return candidate
        took = simulate(candidate).iteration_time
        if best is None or took < best[0]:
            best = (took, candidate)
    assert best is not None
    return best[1]


def _without_cyclic_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """10^5 small tuples, none in a cycle: the cyclic collector would only rescan them."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    return paused


@_without_cyclic_gc
def list_schedule(
    job: PipelineJob,
    graph: IndexedGraph,
    workers: list[Worker],
    priorities: dict[str, int],
    caps: dict[Worker, int],
) -> dict[Worker, list[Op]]:
    """Greedy: each free worker starts its best available op (see the module doc)."""
    push, pop = heapq.heappush, heapq.heappop
    kind, duration = graph.kind, graph.duration
    span = max(graph.tiebreak, default=0) + 1
    rank = [priorities.get(KINDS[k], 0) for k in range(len(KINDS))]
    n = len(workers)
    chosen_ids: list[list[int]] = [[] for _ in range(n)]
    live = [0] * n
    cap = [caps[w] for w in workers]
    available: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    timeline = _Timeline(graph, n)
    finish = _arrivals(graph, job.transfer, timeline)
    _release_sources(graph, timeline, finish)
    pending, free_at = timeline.pending, timeline.free_at
    wake, events = timeline.wake, timeline.events
    while events:
        now, w = pop(events)
        if now != wake[w]:
            continue  # stale: superseded by an earlier event for this worker
        wake[w] = INF
        queue, ready_ops = pending[w], available[w]
        while queue and queue[0][0] <= now:
            j = pop(queue)[1]
            push(ready_ops, (rank[kind[j]] * span + graph.tiebreak[j], j))
        chosen = _best(ready_ops, kind, live[w] >= cap[w])
        if chosen < 0:
            if queue:
                wake[w] = queue[0][0]
                push(events, (wake[w], w))
            continue
        end = now + duration[chosen]
        chosen_ids[w].append(chosen)
        free_at[w] = end
        if kind[chosen] == F_KIND:
            live[w] += 1
        elif kind[chosen] == W_KIND:
            live[w] -= 1
        wake[w] = end  # before finish(): arrivals meanwhile need no event of their own
        push(events, (end, w))
        finish(chosen, end)
    return {w: [graph.op(i) for i in chosen_ids[k]] for k, w in enumerate(workers)}


class _Timeline:
    """list_schedule's simulated time. By op id: the inputs each still waits for, and
    when its last input is there. By worker index: the ops whose inputs are on their way
    (arrival, id), when it is free, its one live event (older ones are stale); and the
    events (time, worker) in time order."""

    def __init__(self, graph: IndexedGraph, n: int) -> None:
        self.waiting = list(graph.npred)
        self.arrival = [0.0] * len(graph.kind)
        self.pending: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        self.free_at = [0.0] * n
        self.wake = [INF] * n
        self.events: list[tuple[float, int]] = []


def _arrivals(
    graph: IndexedGraph, transfer: float, timeline: _Timeline
) -> Callable[[int, float], None]:
    """finish(i, at): op i ends at `at`, and its successors learn when their inputs
    arrive; one whose inputs are all on their way is pending at its worker (a barrier
    finishes at once), and the worker gets an event if it is earlier than its next."""
    push = heapq.heappush
    kind, succs, where_of = graph.kind, graph.succs, graph.worker
    waiting, arrival = timeline.waiting, timeline.arrival
    pending, free_at = timeline.pending, timeline.free_at
    wake, events = timeline.wake, timeline.events

    def finish(i: int, at: float) -> None:
        source, k = where_of[i], kind[i]
        for j in succs[i]:
            target = where_of[j]
            # IndexedGraph.transfer's rule, inlined: this loop runs once per edge.
            ready = at + transfer if (transfer and k == kind[j] and target != source) else at
            if ready > arrival[j]:
                arrival[j] = ready
            waiting[j] -= 1
            if waiting[j]:
                continue
            if target < 0:  # a barrier: instant
                finish(j, arrival[j])
                continue
            push(pending[target], (arrival[j], j))
            at_ = arrival[j] if arrival[j] > free_at[target] else free_at[target]
            if at_ < wake[target]:
                wake[target] = at_
                push(events, (at_, target))

    return finish


def _release_sources(
    graph: IndexedGraph, timeline: _Timeline, finish: Callable[[int, float], None]
) -> None:
    """The ops waiting for no input (in id order, a barrier's successors included once
    it finished), at time 0: pending at their worker; a barrier finishes at once."""
    waiting, pending, wake = timeline.waiting, timeline.pending, timeline.wake
    for i, where in enumerate(graph.worker):
        if waiting[i] == 0:
            if where < 0:
                finish(i, 0.0)
            else:
                heapq.heappush(pending[where], (0.0, i))
                if wake[where] > 0.0:
                    wake[where] = 0.0
                    heapq.heappush(timeline.events, (0.0, where))


def _best(ready_ops: list[tuple[int, int]], kind: list[int], full: bool) -> int:
    """The best ready op (a heap of (priority, id)) taken off it, a forward skipped while
    the worker is `full` (at its cap of micro-batches in flight); -1: none."""
    skipped = []
    chosen = -1
    while ready_ops:
        item = heapq.heappop(ready_ops)
        if full and kind[item[1]] == F_KIND:
            skipped.append(item)
            continue
        chosen = item[1]
        break
    for item in skipped:
        heapq.heappush(ready_ops, item)
    return chosen
