"""Execute a plan event by event: iteration time, busy fractions, peak memory; and
reject a plan that breaks a dependency or the memory limit.

Each worker runs its ops in the plan's order, each as soon as the worker is free and
the op's inputs are there (an input from another worker arrives `transfer` later).
A micro-batch holds a memory slot on a worker from its F to its W there; the slots
in use never exceed the job's memory limit. With two or more iterations simulated,
the iteration time is the steady period: the end of the last iteration minus the end
of the one before (so a staggered optimizer's overlap counts).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from .index import index_graph
from .job import PlannerError, Worker
from .plan import Op, Plan


class PlanRejected(PlannerError):
    """The plan breaks a dependency, misses or repeats work, or overflows memory."""


@dataclass
class SimResult:
    iteration_time: float
    makespan: float
    start: dict[Op, float]
    end: dict[Op, float]
    busy: dict[Worker, float]  # fraction of the makespan each worker computes
    peak_memory: dict[Worker, int]

    def iteration_end(self, iteration: int) -> float:
        return max(t for op, t in self.end.items() if op.iteration == iteration)


def peak_memory(order: list[Op], limit: int, worker: Worker) -> int:
    """Slots in use right after each F: F's started minus W's done so far."""
    live = peak = 0
    for op in order:
        if op.kind == "F":
            live += 1
            peak = max(peak, live)
            if live > limit:
                raise PlanRejected(
                    f"worker {worker[0]}:{worker[1]} holds {live} micro-batches at "
                    f"{op.label()}, over the memory limit of {limit}"
                )
        elif op.kind == "W":
            live -= 1
    return peak


def simulate(plan: Plan) -> SimResult:
    job = plan.job
    workers = plan.workers
    graph = index_graph(job, plan.assignment, workers, plan.iterations, plan.staggered)
    worker_index = {w: i for i, w in enumerate(workers)}
    orders: list[list[int]] = []
    listed: set[int] = set()
    for w, order in plan.orders.items():
        ids = []
        for op in order:
            i = graph.id_of(op)
            if i is not None and i in listed:
                raise PlanRejected(f"{op.label()} (stage {op.stage}) is in the plan twice")
            if i is None or graph.worker[i] != worker_index[w]:
                raise PlanRejected(f"{op.label()} of stage {op.stage} is not worker {w}'s work")
            listed.add(i)
            ids.append(i)
        orders.append(ids)
    missing = [i for i, w in enumerate(graph.worker) if w >= 0 and i not in listed]
    if missing:
        op = graph.op(missing[0])
        raise PlanRejected(f"{op.label()} of stage {op.stage} is never run")
    peaks = {w: peak_memory(order, job.memory, w) for w, order in plan.orders.items()}

    total = len(graph.kind)
    previous = [-1] * total  # the op before, on the same worker
    follows = [-1] * total
    for ids in orders:
        for before, i in itertools.pairwise(ids):
            previous[i], follows[before] = before, i
    preds = graph.preds
    waiting = [len(preds[i]) + (previous[i] >= 0) for i in range(total)]
    begin_at = [0.0] * total
    end_at = [0.0] * total
    done = 0
    ready = deque(i for i in range(total) if waiting[i] == 0)
    while ready:
        i = ready.popleft()
        begin = end_at[previous[i]] if previous[i] >= 0 else 0.0
        for pred in preds[i]:
            begin = max(begin, end_at[pred] + graph.transfer(pred, i))
        begin_at[i], end_at[i] = begin, begin + graph.duration[i]
        done += 1
        for nxt in (*graph.succs[i], *((follows[i],) if follows[i] >= 0 else ())):
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if done != total:
        stuck = graph.op(next(i for i in range(total) if waiting[i] and graph.worker[i] >= 0))
        raise PlanRejected(
            f"the plan breaks a dependency: {stuck.label()} of stage {stuck.stage} waits "
            "for work that is ordered after it"
        )
    start = {graph.op(i): begin_at[i] for ids in orders for i in ids}
    end = {graph.op(i): end_at[i] for ids in orders for i in ids}
    makespan = max(end.values(), default=0.0)
    period = makespan
    if plan.iterations > 1:
        ends = [0.0] * plan.iterations
        for op, t in end.items():
            ends[op.iteration] = max(ends[op.iteration], t)
        period = ends[-1] - ends[-2]
    busy = {
        w: (sum(graph.duration[i] for i in ids) / makespan if makespan else 0.0)
        for w, ids in zip(plan.orders, orders, strict=True)
    }
    return SimResult(period, makespan, start, end, busy, peaks)
