"""The exact planner: an MILP (HiGHS, through scipy.optimize.milp) for small jobs.

Same work, same assignment (ReCycle's re-routing) and same dependencies as the
heuristic; the solver chooses each worker's order to minimise one iteration's time.
Variables: every op's start t_i, the iteration time T, and for every two ops i < j of
one worker a binary y_ij (1: i runs first). Constraints:
  t_j >= t_i + d_i (+ transfer)               every dependency i -> j
  t_j >= t_i + d_i - M (1 - y_ij)             no two ops of a worker overlap
  t_i >= t_j + d_j - M y_ij
  T >= t_i + d_i                              every op
  sum_v z_vu <= L - 1 at every forward F_u    memory: z_vu >= [F_v before F_u] +
                                              [F_u before W_v] - 1 (v is live at F_u)
Exponential in the worst case, so only for small jobs (scipy is the `plan` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from .index import F, IndexedGraph, index_graph
from .job import PipelineJob, PlannerError, Worker
from .plan import (
    Plan,
    check_failures,
    normalize,
    reroute,
    survivors,
)

MAX_OPS = 400  # beyond this the MILP is the wrong tool: use the heuristic


def descendants(succs: Sequence[list[int]], ops: Sequence[int]) -> dict[int, set[int]]:
    """Every op that depends on each op, directly or not."""
    found: dict[int, set[int]] = {}

    def visit(op: int) -> set[int]:
        if op not in found:
            below: set[int] = set()
            for nxt in succs[op]:
                below.add(nxt)
                below |= visit(nxt)
            found[op] = below
        return found[op]

    for op in ops:
        visit(op)
    return found


def topological_rank(preds: Sequence[list[int]], ops: Sequence[int]) -> dict[int, int]:
    rank: dict[int, int] = {}

    def visit(op: int) -> int:
        if op not in rank:
            rank[op] = 1 + max((visit(p) for p in preds[op]), default=0)
        return rank[op]

    for op in ops:
        visit(op)
    return rank


def plan_exact(job: PipelineJob, failed: Iterable[Worker] = (), time_limit: float = 60.0) -> Plan:
    """The iteration-time-optimal plan of one iteration (staggered optimizer)."""
    try:
        import scipy.optimize  # noqa: F401 - whether it is there: _solve imports what it uses
    except ImportError:
        raise PlannerError("the exact planner needs scipy: pip install 'rtrain[plan]'") from None
    lost = check_failures(job, failed)
    canonical, mapping = normalize(job, lost)
    assignment = reroute(job, canonical)
    workers = survivors(job, canonical)
    graph = index_graph(job, assignment, workers, 1, staggered=True)
    ops = list(range(len(graph.kind)))  # ids; t_i is variable i
    if len(ops) > MAX_OPS:
        raise PlannerError(f"{len(ops)} operations: too many for the exact planner (max {MAX_OPS})")
    columns = _columns(graph, ops, len(workers))
    rows = _timing_rows(graph, ops, columns, job.transfer) + _memory_rows(columns, job.memory)
    starts = _solve(columns, rows, _forced_orders(graph, ops, columns), time_limit)
    rank = topological_rank(graph.preds, ops)  # zero-length ops that start together
    orders = {
        w: [
            graph.op(op)
            for op in sorted(
                (op for op in ops if graph.worker[op] == wi),
                key=lambda op: (starts[op], rank[op]),
            )
        ]
        for wi, w in enumerate(workers)
    }
    return Plan(job, lost, "exact", True, 1, assignment, orders, mapping)


Row = tuple[dict[int, float], float, float]  # a constraint: coefficients, lower, upper bound


@dataclass(frozen=True)
class _Columns:
    """The MILP's variables, by column: t_i of every op (0..n-1), T (n), then y_ij of
    every two ops of one worker (1: i first), then z_vu of every two forwards of one
    worker (1: v's activations live at F_u)."""

    n: int
    pairs: list[tuple[int, int]]  # (i, j): y's column is y0 + its index
    lives: list[tuple[int, int]]  # (u, v): z's column is z0 + its index
    pair_index: dict[tuple[int, int], tuple[int, bool]]  # either order -> (y's column, i < j)

    @property
    def y0(self) -> int:
        return self.n + 1

    @property
    def z0(self) -> int:
        return self.y0 + len(self.pairs)

    @property
    def size(self) -> int:
        return self.z0 + len(self.lives)

    def before(self, a: int, b: int) -> tuple[dict[int, float], float]:
        """[a before b] as a linear form: coefficients, constant."""
        var, forward = self.pair_index[(a, b)]
        return ({var: 1.0}, 0.0) if forward else ({var: -1.0}, 1.0)


def _columns(graph: IndexedGraph, ops: list[int], workers: int) -> _Columns:
    n = len(ops)
    pairs = [
        (a, b)
        for w in range(workers)
        for a, b in combinations([op for op in ops if graph.worker[op] == w], 2)
    ]
    pair_index = {}
    for k, (a, b) in enumerate(pairs):
        pair_index[(a, b)] = (n + 1 + k, True)
        pair_index[(b, a)] = (n + 1 + k, False)
    forwards = [op for op in ops if graph.kind[op] == F]
    lives = [
        (u, v) for u in forwards for v in forwards if u != v and graph.worker[u] == graph.worker[v]
    ]
    return _Columns(n, pairs, lives, pair_index)


def _timing_rows(
    graph: IndexedGraph, ops: list[int], columns: _Columns, transfer: float
) -> list[Row]:
    """Every dependency, T after every op, and no two ops of a worker overlapping."""
    n = columns.n
    big = sum(graph.duration) + transfer * len(ops) + 1.0
    rows: list[Row] = []
    for op in ops:
        for pred in graph.preds[op]:
            gap = graph.duration[pred] + graph.transfer(pred, op)
            rows.append(({op: 1.0, pred: -1.0}, gap, math.inf))
        rows.append(({n: 1.0, op: -1.0}, graph.duration[op], math.inf))
    for k, (a, b) in enumerate(columns.pairs):
        y = columns.y0 + k
        rows.append(({b: 1.0, a: -1.0, y: -big}, graph.duration[a] - big, math.inf))
        rows.append(({a: 1.0, b: -1.0, y: big}, graph.duration[b], math.inf))
    return rows


def _memory_rows(columns: _Columns, memory: int) -> list[Row]:
    """z_vu >= [F_v before F_u] + [F_u before W_v] - 1, and at most memory - 1 other
    forwards' activations live at each F_u."""
    rows: list[Row] = []
    by_u: dict[int, list[int]] = {}
    for k, (u, v) in enumerate(columns.lives):
        first, c1 = columns.before(v, u)
        second, c2 = columns.before(u, v + 2)  # v's W: a unit's F, B, W ids are consecutive
        coeffs = {columns.z0 + k: 1.0}
        for form in (first, second):
            for var, c in form.items():
                coeffs[var] = coeffs.get(var, 0.0) - c
        rows.append((coeffs, c1 + c2 - 1.0, math.inf))
        by_u.setdefault(u, []).append(columns.z0 + k)
    for zs in by_u.values():
        rows.append((dict.fromkeys(zs, 1.0), -math.inf, memory - 1.0))
    return rows


def _forced_orders(
    graph: IndexedGraph, ops: list[int], columns: _Columns
) -> tuple[list[float], list[float]]:
    """Each column's bounds. An order the dependencies already force is not a choice:
    those y's are fixed."""
    after = descendants(graph.succs, ops)
    low = [0.0] * columns.size
    high = [math.inf] * columns.y0 + [1.0] * (columns.size - columns.y0)
    for k, (a, b) in enumerate(columns.pairs):
        if b in after[a]:
            low[columns.y0 + k] = 1.0
        elif a in after[b]:
            high[columns.y0 + k] = 0.0
    return low, high


def _solve(
    columns: _Columns,
    rows: list[Row],
    bounds: tuple[list[float], list[float]],
    time_limit: float,
) -> list[float]:
    """HiGHS' solution minimising T: every column's value (t_i first)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    matrix = lil_matrix((len(rows), columns.size))
    lower, upper = np.empty(len(rows)), np.empty(len(rows))
    for r, (coeffs, lo, hi) in enumerate(rows):
        for var, c in coeffs.items():
            matrix[r, var] = c
        lower[r], upper[r] = lo, hi
    cost = np.zeros(columns.size)
    cost[columns.n] = 1.0
    integrality = np.zeros(columns.size)
    integrality[columns.y0 :] = 1
    result = milp(
        cost,
        integrality=integrality,
        bounds=Bounds(np.array(bounds[0]), np.array(bounds[1])),
        constraints=LinearConstraint(matrix.tocsr(), lower, upper),
        options={"time_limit": time_limit},
    )
    if result.x is None:
        raise PlannerError(f"the exact planner found no schedule: {result.message}")
    return [float(x) for x in result.x]
