"""What `rtrain status` shows of a running job: each agent's status record, and the job
view assembled from the store's records. Pure: no I/O, no clock (times are passed in).

Each agent of a running generation writes one small record under
r<g>/status/<node> every status_period(nodes) seconds (STATUS_EVERY_S up to 64 nodes,
then in proportion: the job's writes stay at 12.8 a second at any size): when (its
wall clock), its state, how many workers it runs, their global ranks and the step
each last gave in a heartbeat, the newest snapshot step committed and replicated, and
the node's last repair in place (what its `repair` event said), if it made one.
A reader turns the records, the membership and the failure ledger into a JobStatus.
The record is read from the store, so anything may be there: decode() refuses
whatever rtrain did not write.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..rendezvous.failures import FailureRecord, failure_roles
from ..rendezvous.fault_history import FaultEntry
from ..rendezvous.protocol import Membership, ProtocolError, json_object
from .repairs import RepairError, RepairNote, merge
from .through import ThroughError, ThroughNote
from .through import merged as merged_through

STATUS_VERSION = 1
STATUS_EVERY_S = 5.0
# Up to this many nodes each writes its record every STATUS_EVERY_S; past it, less often
# in proportion (status_period), so the job's status writes stay at 64 / 5 s = 12.8 a
# second at any size (2,000 nodes at 5 s each were 400 a second).
STATUS_FULL_RATE_NODES = 64
# A record older than this many publishing periods: its agent is not renewing it.
STALE_PERIODS = 3
MAX_WORKERS = 4096  # a record claiming more is refused (a node runs a few dozen at most)


def status_period(num_nodes: int) -> float:
    """Seconds between one agent's status records in a job of num_nodes nodes: the writer
    (the agent's observer) and the reader's staleness rule (node_views) both use it."""
    return STATUS_EVERY_S * max(1.0, num_nodes / STATUS_FULL_RATE_NODES)


@dataclass(frozen=True)
class NodeStatus:
    """One agent's record: written by the agent, read by `rtrain status`."""

    t: float  # the agent's wall clock when it wrote the record
    state: str
    ranks: tuple[int, ...]  # global rank of each local worker
    steps: tuple[int | None, ...]  # each worker's last heartbeat step (None: none yet)
    committed: int | None = None  # newest snapshot step this node's workers committed
    replicated: int | None = None  # newest of them safe on peers
    repair: RepairNote | None = None  # this node's last repair in place, if any
    through: ThroughNote | None = None  # its kept ranks training through, if they do
    # its ranks found slow (docs/stragglers.md): (rank, times slower, since: wall clock)
    stragglers: tuple[tuple[int, float, float], ...] = ()

    def encode(self) -> str:
        repair = {} if self.repair is None else {"repair": self.repair.as_json()}
        through = {} if self.through is None else {"through": self.through.as_json()}
        slow = {"stragglers": [list(s) for s in self.stragglers]} if self.stragglers else {}
        return json.dumps(
            {
                "v": STATUS_VERSION,
                "t": round(self.t, 3),
                "state": self.state,
                "ranks": list(self.ranks),
                "steps": list(self.steps),
                "committed": self.committed,
                "replicated": self.replicated,
                **repair,
                **through,
                **slow,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, payload: bytes | str) -> NodeStatus:
        data = json_object(payload, "status record")
        if data.get("v") != STATUS_VERSION:
            raise ProtocolError(f"status record: version {data.get('v')!r} is not {STATUS_VERSION}")
        t, state = data.get("t"), data.get("state")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
            raise ProtocolError("status record: t must be a finite number")
        if not isinstance(state, str) or not state or len(state) > 32:
            raise ProtocolError("status record: state must be a short string")
        ranks = _int_list(data.get("ranks"), "ranks", allow_none=False)
        steps = _int_list(data.get("steps"), "steps", allow_none=True)
        if len(ranks) != len(steps):
            raise ProtocolError("status record: ranks and steps differ in length")
        committed = _optional_step(data.get("committed"), "committed")
        replicated = _optional_step(data.get("replicated"), "replicated")
        repair = _repair(data.get("repair"))
        through = _through(data.get("through"))
        stragglers = _stragglers(data.get("stragglers"))
        return cls(
            float(t),
            state,
            tuple(ranks),  # type: ignore[arg-type]
            tuple(steps),
            committed,
            replicated,
            repair,
            through,
            stragglers,
        )


def _stragglers(value: Any) -> tuple[tuple[int, float, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_WORKERS:
        raise ProtocolError("status record: stragglers must be a list")
    found = []
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise ProtocolError("status record: a straggler is [rank, slower, since]")
        rank, slower, since = item
        numbers = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in (slower, since)
        )
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0 or not numbers:
            raise ProtocolError("status record: a straggler is [rank, slower, since]")
        found.append((rank, float(slower), float(since)))
    return tuple(found)


def _repair(value: Any) -> RepairNote | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("status record: repair must be an object or null")
    try:
        return RepairNote.from_fields(value)
    except RepairError as exc:
        raise ProtocolError(f"status record: repair: {exc}") from None


def _through(value: Any) -> ThroughNote | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("status record: through must be an object or null")
    try:
        return ThroughNote.from_fields(value)
    except ThroughError as exc:
        raise ProtocolError(f"status record: through: {exc}") from None


def _int_list(value: Any, name: str, allow_none: bool) -> list[int | None]:
    if not isinstance(value, list) or len(value) > MAX_WORKERS:
        raise ProtocolError(f"status record: {name} must be a list of at most {MAX_WORKERS}")
    for item in value:
        if item is None and allow_none:
            continue
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ProtocolError(f"status record: {name} holds {item!r}, not a step or rank")
    return list(value)


def _optional_step(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"status record: {name} must be a non-negative integer or null")
    return value


@dataclass(frozen=True)
class NodeView:
    node_rank: int
    addr: str
    workers: int
    status: NodeStatus | None  # None: no record yet (starting) or one refused
    age_s: float | None  # seconds since the record was written, by the reader's clock
    problem: str = ""  # why the record was refused, or that it is stale, or lost

    @property
    def seen(self) -> bool:
        return self.status is not None and not self.problem


@dataclass(frozen=True)
class FailureView:
    generation: int
    kind: str
    node_rank: int
    host: str
    rank: int | None
    time: float
    message: str
    # its part in its generation's failure: "root cause", "victim" (a consequence: its
    # collective broke under it), or "" (core.rendezvous.failures.failure_roles)
    role: str = ""


@dataclass(frozen=True)
class JobStatus:
    run_id: str
    round: int  # the open round (the generation forming, or running)
    generation: int | None  # the newest closed generation, or None (none closed yet)
    running: bool  # `generation` is the open round: no new round is forming
    joined: int  # agents in the open round, while it forms
    nodes: tuple[NodeView, ...]
    failures: tuple[FailureView, ...]
    failures_from: int  # failures of generations before this one were not read
    reads: int = 0  # store requests the reader made
    fault_history: tuple[FaultEntry, ...] = ()  # the nodes' (core/rendezvous/fault_history)

    @property
    def step(self) -> int | None:
        """The step every reporting worker has reached (the slowest one's)."""
        steps = [s for n in self.nodes if n.status for s in n.status.steps if s is not None]
        return min(steps) if steps else None

    @property
    def last_repair(self) -> RepairNote | None:
        """The job's newest repair in place, as far as the nodes' records say (every
        node that repaired it: their ranks together)."""
        notes = [n.status.repair for n in self.nodes if n.status and n.status.repair]
        merged = merge(notes)
        return merged[max(merged)] if merged else None

    @property
    def stragglers(self) -> list[dict[str, Any]]:
        """The ranks the nodes' records name slow: node, rank, slower, since."""
        return [
            {"node": n.node_rank, "rank": r, "slower": slower, "since": since}
            for n in self.nodes
            if n.status
            for r, slower, since in n.status.stragglers
        ]

    @property
    def through(self) -> ThroughNote | None:
        """The running generation's train-through, as the nodes' records say."""
        return merged_through(
            [n.status.through for n in self.nodes if n.status and n.status.through]
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "round": self.round,
            "generation": self.generation,
            "running": self.running,
            "joined": self.joined,
            "step": self.step,
            "nodes": [
                {
                    "node_rank": n.node_rank,
                    "addr": n.addr,
                    "workers": n.workers,
                    "age_s": None if n.age_s is None else round(n.age_s, 3),
                    "problem": n.problem or None,
                    "state": n.status.state if n.status else None,
                    "ranks": list(n.status.ranks) if n.status else [],
                    "steps": list(n.status.steps) if n.status else [],
                    "committed": n.status.committed if n.status else None,
                    "replicated": n.status.replicated if n.status else None,
                    "repair": n.status.repair.as_json() if n.status and n.status.repair else None,
                }
                for n in self.nodes
            ],
            "last_repair": None if self.last_repair is None else self.last_repair.as_json(),
            "through": None if self.through is None else self.through.as_json(),
            "stragglers": self.stragglers,
            "failures": [vars(f) for f in self.failures],
            "failures_from_generation": self.failures_from,
            "store_reads": self.reads,
            "fault_history": [asdict(e) for e in self.fault_history],
        }


def node_views(
    membership: Membership,
    records: Sequence[bytes | None],
    lost: Sequence[int],
    now: float,
) -> tuple[NodeView, ...]:
    """The members of a running generation with their records (None: not written yet)."""
    views = []
    stale_after = STALE_PERIODS * status_period(len(membership.members))
    for rank, (member, payload) in enumerate(zip(membership.members, records, strict=True)):
        status, age, problem = None, None, ""
        if payload is not None:
            try:
                status = NodeStatus.decode(payload)
            except ProtocolError as exc:
                problem = f"refused: {exc}"
        if status is not None:
            age = max(now - status.t, 0.0)
            if age > stale_after:
                problem = f"not renewed for {age:.0f}s"
        if rank in lost:
            problem = "lost (its lease expired)"
        views.append(NodeView(rank, member.addr, member.local_world_size, status, age, problem))
    return tuple(views)


def failure_views(by_generation: Mapping[int, Sequence[FailureRecord]]) -> tuple[FailureView, ...]:
    """Every failure record read, oldest generation first, each in time order, with its
    part in its generation's failure."""
    out = []
    for generation in sorted(by_generation):
        records = sorted(by_generation[generation], key=lambda r: r.time)
        for r, role in zip(records, failure_roles(records), strict=True):
            out.append(
                FailureView(
                    generation,
                    r.kind.value,
                    r.node_rank,
                    r.host,
                    r.rank,
                    r.time,
                    r.message.splitlines()[0][:200] if r.message else "",
                    role,
                )
            )
    return tuple(out)
