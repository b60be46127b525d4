"""What a plan is worth, side by side with the alternatives; its per-rank action list;
and its timeline as an SVG picture. Pure: returns data and text, writes nothing.

The alternatives for one failure set:
- fault-free: 1F1B on every worker (the reference);
- ReCycle: the adaptive plan (re-routing, decoupled B/W, staggered optimizer);
- drop: the replicas that lost a worker are dropped and their micro-batches spread
  over the others (same global batch);
- restart: stop, replace the nodes and resume from a checkpoint, at full size: its
  throughput is the fault-free one times 1 - failure rate x restart cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from .job import PipelineJob, Worker
from .plan import NoSurvivor, Plan
from .scheduler import plan
from .sim import SimResult, simulate

COLOURS = {"F": "#4c78a8", "B": "#59a14f", "W": "#f28e2b", "OPT": "#9d9d9d"}


@dataclass
class Option:
    name: str
    iteration_time: float | None  # None: not possible for this failure set
    throughput: float | None  # relative to fault-free
    workers: int
    note: str


def compare(
    job: PipelineJob,
    failed: list[Worker],
    restart_cost: float,
    failures_per_hour: float,
) -> tuple[list[Option], Plan | None, SimResult | None]:
    """The four options for this failure set, and ReCycle's plan and simulation."""
    reference = simulate(plan(job, (), "1f1b"))
    base = reference.iteration_time
    options = [Option("fault-free (1F1B)", base, 1.0, job.dp * job.pp, "reference")]
    recycle_plan: Plan | None = None
    recycle_sim: SimResult | None = None
    try:
        recycle_plan = plan(job, failed, "recycle")
        recycle_sim = simulate(recycle_plan)
        t = recycle_sim.iteration_time
        options.append(
            Option("ReCycle (adaptive)", t, base / t, len(recycle_plan.orders), "re-routed")
        )
    except NoSurvivor as exc:
        options.append(Option("ReCycle (adaptive)", None, None, 0, str(exc)))
    try:
        dropped = plan(job, failed, "drop")
        t = simulate(dropped).iteration_time
        lost = len({r for r, _ in failed})
        options.append(
            Option("drop replicas", t, base / t, len(dropped.orders), f"{lost} replica(s) dropped")
        )
    except NoSurvivor as exc:
        options.append(Option("drop replicas", None, None, 0, str(exc)))
    kept = max(0.0, 1.0 - failures_per_hour * restart_cost / 3600.0)
    options.append(
        Option(
            "restart from checkpoint",
            base / kept if kept else None,
            kept,
            job.dp * job.pp,
            f"{restart_cost:g} s per restart at {failures_per_hour:g} failures/hour",
        )
    )
    return options, recycle_plan, recycle_sim


def action_list(p: Plan, sim: SimResult) -> dict[str, Any]:
    """The plan as each physical worker's actions, for a pipeline runtime to follow.

    {"dp", "pp", "microbatches", "failed": [[replica, stage]], "iteration_time",
     "workers": [{"worker": [replica, stage], "logical": [replica, stage],
                  "actions": [{"op": "F"|"B"|"W"|"OPT", "iteration", "replica",
                               "microbatch", "stage", "start", "end",
                               "recv_from": [replica, stage] | null,
                               "send_to": [replica, stage] | null}]}]}
    A forward receives the activation from the worker that ran the previous stage of
    that micro-batch and sends its output to the next; a B receives the gradient from
    the next stage and sends to the previous; OPT all-reduces with its stage's peers.
    """
    job = p.job
    last = job.pp - 1

    def peer(replica: int, microbatch: int, stage: int) -> list[int] | None:
        if not 0 <= stage <= last:
            return None
        return list(p.physical(p.assignment[(replica, microbatch, stage)]))

    workers = []
    for logical, order in sorted(p.orders.items(), key=lambda kv: p.physical(kv[0])):
        actions = []
        for op in order:
            entry: dict[str, Any] = {
                "op": op.kind,
                "iteration": op.iteration,
                "replica": op.replica if op.kind != "OPT" else None,
                "microbatch": op.microbatch if op.kind != "OPT" else None,
                "stage": op.stage,
                "start": round(sim.start[op], 6),
                "end": round(sim.end[op], 6),
                "recv_from": None,
                "send_to": None,
            }
            r, m, s = op.replica, op.microbatch, op.stage
            if op.kind == "F":
                entry["recv_from"], entry["send_to"] = peer(r, m, s - 1), peer(r, m, s + 1)
            elif op.kind == "B":
                entry["recv_from"], entry["send_to"] = peer(r, m, s + 1), peer(r, m, s - 1)
            actions.append(entry)
        workers.append(
            {"worker": list(p.physical(logical)), "logical": list(logical), "actions": actions}
        )
    return {
        "dp": job.dp,
        "pp": job.pp,
        "microbatches": job.microbatches,
        "failed": sorted([list(w) for w in p.failed]),
        "iteration_time": sim.iteration_time,
        "workers": workers,
    }


def disordered_pairs(actions: Mapping[str, Any], iteration: int = 0) -> list[tuple[Worker, Worker]]:
    """The (sender, receiver) pairs of an action list whose messages of one iteration
    the receiver takes in another order than the sender sends them: what a backend
    that matches point-to-point messages by order alone (NCCL; no tags) cannot run."""
    sent: dict[tuple[Worker, Worker], list[tuple[str, int, int]]] = {}
    taken: dict[tuple[Worker, Worker], list[tuple[str, int, int]]] = {}
    for worker in actions["workers"]:
        me = (int(worker["worker"][0]), int(worker["worker"][1]))
        for a in worker["actions"]:
            if a["iteration"] != iteration or a["op"] not in ("F", "B"):
                continue
            message = (a["op"], int(a["replica"]), int(a["microbatch"]))
            if a["send_to"] is not None:
                to = (int(a["send_to"][0]), int(a["send_to"][1]))
                sent.setdefault((me, to), []).append(message)
            if a["recv_from"] is not None:
                source = (int(a["recv_from"][0]), int(a["recv_from"][1]))
                taken.setdefault((source, me), []).append(message)
    return sorted(pair for pair in set(sent) | set(taken) if sent.get(pair) != taken.get(pair))


@dataclass(frozen=True)
class TimelineRow:
    """One worker's row of a timeline picture."""

    label: str  # "r<replica> s<stage>"
    failed: bool
    blocks: list[tuple[str, float, float, str]]  # (kind, start, end, what), in time order


def timeline_rows(p: Plan, sim: SimResult) -> list[TimelineRow]:
    """A row per worker of the grid (physical, failed ones marked), stage by stage, and a
    block per op: what a timeline picture draws (SVG here, PNG in the CLI)."""
    job = p.job
    by_physical = {p.physical(w): order for w, order in p.orders.items()}
    rows = []
    for stage in range(job.pp):
        for replica in range(job.dp):
            worker = (replica, stage)
            blocks = [
                (op.kind, sim.start[op], sim.end[op], f"{op.label()} stage {op.stage}")
                for op in by_physical.get(worker, [])
                if sim.end[op] > sim.start[op]
            ]
            rows.append(TimelineRow(f"r{replica} s{stage}", worker in p.failed, blocks))
    return rows


def timeline_svg(p: Plan, sim: SimResult, title: str, width: int = 1200) -> str:
    """One row per worker (physical, failed ones marked), a block per op, idle blank."""
    rows = timeline_rows(p, sim)
    span = max(sim.makespan, 1e-9)
    left, top, height, gap = 90, 40, 14, 3
    scale = (width - left - 20) / span
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{top + len(rows) * (height + gap) + 40}" font-family="monospace" '
        'font-size="11">',
        f'<text x="10" y="20" font-size="14">{escape(title)}</text>',
    ]
    for i, row in enumerate(rows):
        y = top + i * (height + gap)
        parts.append(f'<text x="10" y="{y + height - 3}">{row.label}</text>')
        parts.append(
            f'<rect x="{left}" y="{y}" width="{span * scale:.1f}" height="{height}" '
            'fill="#f4f4f4"/>'
        )
        if row.failed:
            parts.append(f'<text x="{left + 4}" y="{y + height - 3}" fill="#c00">failed</text>')
            continue
        for kind, start, end, what in row.blocks:
            x, w = left + start * scale, (end - start) * scale
            tip = escape(f"{what}: {start:.2f}-{end:.2f}")
            parts.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{height}" '
                f'fill="{COLOURS[kind]}" stroke="white" stroke-width="0.5">'
                f"<title>{tip}</title></rect>"
            )
    y = top + len(rows) * (height + gap) + 20
    for k, (kind, colour) in enumerate(COLOURS.items()):
        parts.append(
            f'<rect x="{left + k * 90}" y="{y - 10}" width="12" height="12" fill="{colour}"/>'
        )
        parts.append(f'<text x="{left + k * 90 + 16}" y="{y}">{kind}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
