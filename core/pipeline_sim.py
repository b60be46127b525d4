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

from rtrain.core.pipeline_job import PlannerError, Worker
from rtrain.core.pipeline_plan import Graph, Op, Plan, build_graph


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


def transfer_between(graph: Graph, pred: Op, op: Op, transfer: float) -> float:
    """Activations (F -> F) and gradients (B -> B) cross workers; nothing else does."""
    a, b = graph.worker[pred], graph.worker[op]
    if a is None or b is None or a == b or pred.kind != op.kind or op.kind not in "FB":
        return 0.0
    return transfer


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
    graph = build_graph(job, plan.assignment, plan.workers, plan.iterations, plan.staggered)
    expected = {op for op, w in graph.worker.items() if w is not None}
    listed: set[Op] = set()
    for w, order in plan.orders.items():
        for op in order:
            if op in listed:
                raise PlanRejected(f"{op.label()} (stage {op.stage}) is in the plan twice")
            if graph.worker.get(op) != w:
                raise PlanRejected(f"{op.label()} of stage {op.stage} is not worker {w}'s work")
            listed.add(op)
    if listed != expected:
        missing = sorted(expected - listed)[0]
        raise PlanRejected(f"{missing.label()} of stage {missing.stage} is never run")
    peaks = {w: peak_memory(order, job.memory, w) for w, order in plan.orders.items()}

    previous = {}
    for order in plan.orders.values():
        for before, op in itertools.pairwise(order):
            previous[op] = before
    waiting = {op: len(graph.preds[op]) + (op in previous) for op in graph.worker}
    follows = {before: op for op, before in previous.items()}
    start: dict[Op, float] = {}
    end: dict[Op, float] = {}
    ready = deque(op for op, n in waiting.items() if n == 0)
    while ready:
        op = ready.popleft()
        begin = end[previous[op]] if op in previous else 0.0
        for pred in graph.preds[op]:
            begin = max(begin, end[pred] + transfer_between(graph, pred, op, job.transfer))
        start[op], end[op] = begin, begin + graph.duration[op]
        for nxt in [*graph.succs[op], *([follows[op]] if op in follows else [])]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(end) != len(graph.worker):
        stuck = min(op for op in graph.worker if op not in end and op.kind != "SYNC")
        raise PlanRejected(
            f"the plan breaks a dependency: {stuck.label()} of stage {stuck.stage} waits "
            "for work that is ordered after it"
        )
    makespan = max(end.values(), default=0.0)
    period = makespan
    if plan.iterations > 1:
        ends = [0.0] * plan.iterations
        for op, t in end.items():
            ends[op.iteration] = max(ends[op.iteration], t)
        period = ends[-1] - ends[-2]
    busy = {
        w: (sum(graph.duration[op] for op in order) / makespan if makespan else 0.0)
        for w, order in plan.orders.items()
    }
    return SimResult(period, makespan, start, end, busy, peaks)
