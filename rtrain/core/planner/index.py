"""The iteration's graph with integer ids, for the greedy scheduler.

Every op is an index into flat lists: a plan for DP=64, PP=16 and 32 micro-batches
has 10^5 ops, and tuples in dicts would cost the scheduler most of its time. Ids are
arithmetic, so no op object is made until a plan's orders are written out. The
scheduler, the simulator and the exact planner all work on this one graph.

Dependencies: F(s-1) -> F(s); F(P-1) -> B(P-1); B(s+1) -> B(s); B -> W; every W of a
stage (of the whole job when not staggered) -> its all-reduce barrier -> each OPT;
and into the next iteration, a worker's OPT -> its forwards (staggered), or every
OPT -> a gate -> every forward.

  per iteration, in this order: F, B, W of unit u = (replica * M + microbatch) * P +
  stage at 3u, 3u+1, 3u+2; every worker's OPT; one all-reduce barrier per stage (one
  for the whole job when not staggered); the gate before the next iteration (sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .job import PipelineJob, Worker
from .plan import Op, Unit

KINDS = ("F", "B", "W", "OPT", "SYNC")
F, B, W, OPT, SYNC = range(5)


@dataclass
class IndexedGraph:
    job: PipelineJob
    workers: list[Worker]
    iterations: int
    per_iteration: int
    worker: list[int]  # index into workers; -1 for a barrier
    kind: list[int]
    duration: list[float]
    succs: list[list[int]]
    npred: list[int]
    tiebreak: list[int]  # (iteration, microbatch, replica) as one int: FIFO within a kind

    def id_of(self, op: Op) -> int | None:
        """The id of a compute or optimizer op, or None if the graph has no such op."""
        job = self.job
        if not 0 <= op.iteration < self.iterations:
            return None
        base = op.iteration * self.per_iteration
        if op.kind == "OPT":
            index = self._worker_index.get((op.replica, op.stage))
            return None if index is None else base + 3 * self._units + index
        if op.kind not in ("F", "B", "W") or not (
            0 <= op.replica < job.dp
            and 0 <= op.microbatch < job.microbatches
            and 0 <= op.stage < job.pp
        ):
            return None
        unit = (op.replica * job.microbatches + op.microbatch) * job.pp + op.stage
        return base + 3 * unit + KINDS.index(op.kind)

    @cached_property
    def preds(self) -> list[list[int]]:
        found: list[list[int]] = [[] for _ in self.kind]
        for i, after in enumerate(self.succs):
            for j in after:
                found[j].append(i)
        return found

    def transfer(self, a: int, b: int) -> float:
        """What edge a -> b pays: activations (F -> F) and gradients (B -> B) that cross
        workers take the job's transfer time; nothing else does."""
        k = self.kind[a]
        if k == self.kind[b] and k in (F, B) and self.worker[a] != self.worker[b]:
            return self.job.transfer
        return 0.0

    @cached_property
    def _units(self) -> int:
        return self.job.dp * self.job.microbatches * self.job.pp

    @cached_property
    def _worker_index(self) -> dict[Worker, int]:
        return {w: i for i, w in enumerate(self.workers)}

    def op(self, i: int) -> Op:
        job = self.job
        it, rem = divmod(i, self.per_iteration)
        units = 3 * job.dp * job.microbatches * job.pp
        if rem < units:
            u, k = divmod(rem, 3)
            rm, s = divmod(u, job.pp)
            r, m = divmod(rm, job.microbatches)
            return Op(KINDS[k], it, r, m, s)
        rem -= units
        if rem < len(self.workers):
            r, s = self.workers[rem]
            return Op("OPT", it, r, -1, s)
        return Op("SYNC", it, -1, -1, rem - len(self.workers))


def index_graph(
    job: PipelineJob,
    assignment: dict[Unit, Worker],
    workers: list[Worker],
    iterations: int,
    staggered: bool,
) -> IndexedGraph:
    d, m_count, p = job.dp, job.microbatches, job.pp
    units = d * m_count * p
    n_workers = len(workers)
    per = 3 * units + n_workers + p + 1
    total = per * iterations
    wid = {w: i for i, w in enumerate(workers)}
    worker = [-1] * total
    kind = [SYNC] * total
    duration = [0.0] * total
    succs: list[list[int]] = [[] for _ in range(total)]
    npred = [0] * total
    tiebreak = [0] * total
    stage_of_worker = [w[1] for w in workers]
    f_dur, b_dur, w_dur, o_dur = job.forward, job.backward_input, job.backward_weight, job.optimizer

    def edge(a: int, b: int) -> None:
        succs[a].append(b)
        npred[b] += 1

    unit_worker = [0] * units
    for (r, mb, s), w in assignment.items():
        unit_worker[(r * m_count + mb) * p + s] = wid[w]
    for it in range(iterations):
        base = it * per
        opt0 = base + 3 * units
        reduce0 = opt0 + n_workers
        gate = reduce0 + p
        for u in range(units):
            rm, s = divmod(u, p)
            r, mb = divmod(rm, m_count)
            f = base + 3 * u
            on = unit_worker[u]
            order = (it * m_count + mb) * d + r
            for k, (dur, i) in enumerate(((f_dur[s], f), (b_dur[s], f + 1), (w_dur[s], f + 2))):
                worker[i], kind[i], duration[i], tiebreak[i] = on, k, dur, order
            if s:
                edge(f - 3, f)  # F of the previous stage
            if s == p - 1:
                edge(f, f + 1)
            else:
                edge(f + 4, f + 1)  # B of the next stage
            edge(f + 1, f + 2)
            edge(f + 2, reduce0 + (s if staggered else 0))
            if it:
                prev_opt = (it - 1) * per + 3 * units + on
                edge(prev_opt if staggered else gate, f)
        for i in range(n_workers):
            o = opt0 + i
            worker[o], kind[o], duration[o] = i, OPT, o_dur[stage_of_worker[i]]
            tiebreak[o] = it * m_count * d
            edge(reduce0 + (stage_of_worker[i] if staggered else 0), o)
            if it and not staggered:
                edge((it - 1) * per + 3 * units + i, gate)
    return IndexedGraph(
        job, workers, iterations, per, worker, kind, duration, succs, npred, tiebreak
    )
