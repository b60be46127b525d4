"""rtrain's structured events: one JSON object per line in <run log dir>/events.jsonl,
appended by each node's agent, read by `rtrain report`, by tests, by anyone's tools.

Every line has the same envelope:

  {"v": 1, "event": NAME, "t": unix seconds, "agent": the node's address,
   "node": the node's rank in the generation (null before the first),
   "generation": the generation (null before the first), ...fields}

and the fields of its event (SCHEMA: name -> required fields; more may follow, and a
reader ignores fields it does not know). A new field is no new version; a field that
changes meaning or goes away is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

EVENTS_VERSION = 1
EVENTS_FILE = "events.jsonl"
ENVELOPE = ("v", "event", "t", "agent", "node", "generation")

# name -> (required fields, what the event says); README.md's table is made from it.
SCHEMA: dict[str, tuple[tuple[str, ...], str]] = {
    "agent_start": (
        ("nproc", "run_id", "backend", "max_restarts"),
        "the agent started: its workers per node, the job, the store backend",
    ),
    "generation_start": (
        ("nodes", "world_size", "members", "restored_step"),
        "this node's workers started in a new generation; members: every node's address; "
        "restored_step: the step they resume after (null: from scratch); warm_up_wait_s: "
        "how long their start waited for the worker pool's warm-up imports (a fork must "
        "not come during one; at most 5 s a spawn)",
    ),
    "restore": (
        ("step", "source", "local", "fetched", "from_dp_peer", "seconds"),
        "the shards this node's workers restore: source memory, disk or none; how many "
        "from local memory, from peers, from a DP peer's shard; how long it took",
    ),
    "prefetch": (
        ("step", "shards", "local", "fetched", "failed", "seconds"),
        "before its workers start, this node fetched the other ranks' shards of the "
        "restored DCP save that their resharding load is expected to read: how many, from "
        "local memory, from peers, how many could not be had (the load asks for those), "
        "how long it took",
    ),
    "shard_request": (
        ("rank", "step", "shards", "failed", "seconds"),
        "a worker's DCP load asked its agent for other ranks' shards of step (not "
        "prefetched): how many, how many could not be had, how long the fetch took",
    ),
    "fault": (
        ("kind", "rank", "fault_node", "host", "fault_t", "message"),
        "a fault this node saw or declared: kind (FailureKind: exited, signaled, hung, "
        "lost_node, gpu, ...), the global rank (null: the node), the node rank and host "
        "it happened on, when it happened (fault_t) and what it was; detect_s: how long "
        "it took to notice, where known; victim: true for a consequence of another rank's "
        "fault (its collective broke under it, or it hung waiting in one)",
    ),
    "generation_end": (
        ("outcome", "seconds", "last_step", "reached_step"),
        "this node's generation ended: outcome (succeeded, local_failure, gpu_fault, "
        "membership_change), its length, the newest step its workers committed to a "
        "snapshot and the newest their heartbeat gave (null: none); first_seen_step and "
        "first_seen_t: the first heartbeat step seen and when (the step rate), last_beat_t: "
        "when their heartbeats last moved (a hang or an unfinished job costs from then); "
        "snapshot_s: the seconds its slowest worker spent in rtrain.snapshot()",
    ),
    "recovery": (
        ("from_generation", "down_s", "lost_steps"),
        "this node's workers train again after a failure ended from_generation: down_s "
        "from that generation's end to their first step after it (at_step: the step "
        "their heartbeats gave then, seen within 0.25 s; null: they gave none, and "
        "down_s runs to their start); lost_steps: steps its workers had committed past "
        "the restored step; first_step: the step their first heartbeat stands for (its step "
        "less the beats before it: exact when heartbeat() is called once a step)",
    ),
    "repair": (
        ("from_generation", "kept", "restarted", "fallback", "seconds"),
        "repair in place (rtrain.repairable): this node's workers of from_generation that "
        "were kept alive into the next generation (kept: their ranks then), the ranks "
        "started afresh from the pool (restarted: the failed ones and those in fallback), "
        "those among them asked to repair that did not park in time and were stopped "
        "(fallback; stuck: those of them that said they were still blocked after their "
        "release, stopped at once rather than after the wait), and how long the parking "
        "took; fault_seen, spawn_started (null: "
        "nothing to replace) and parked: when (unix seconds) the agent saw the fault, "
        "began forking the replacements and had its survivors parked",
    ),
    "repair_lost": (
        ("from_generation", "rank", "pid", "why"),
        "a worker that the repair of from_generation kept (its rank then, its pid) could "
        "not enter the next generation: stopped or a zombie while parked (ended, SIGKILL "
        "and reaped, before its replacement started) or gone; it was replaced, so the "
        "repair kept one rank fewer than its `repair` event says",
    ),
    "train_through": (
        ("kept", "joining", "shares"),
        "this node's kept workers train on at reduced size in the generation while new "
        "ranks start up (rtrain.repairable(train_through=True)): the kept ranks, the new "
        "ranks joining when warm, and which logical data ranks each kept rank holds "
        "(shares: rank -> logical ranks)",
    ),
    "full_size": (
        ("joined", "reduced_s"),
        "the generation's whole group runs again: this node's new ranks that joined, and "
        "how long its kept ranks trained at reduced size (null: none of its own did)",
    ),
    "straggler": (
        ("rank", "slower", "since", "gpu"),
        "a rank of this node computes slower than its peers (docs/stragglers.md): slower, "
        "its compute per logical data rank over its peers' median; since, when it began; "
        "compute_s, peers_compute_s, wait_s, peers_wait_s; gpu: NVML's clocks, "
        "temperature and throttle reasons (null: no NVML)",
    ),
    "straggler_cleared": (("rank", "slow_s"), "a straggler of this node keeps pace again"),
    "spare_started": (
        ("slot", "pid"),
        "a warm spare worker started on this node (--spares-per-node): it runs the "
        "script's start-up and waits at the entry of rtrain.repairable for a rank "
        "(folder: its control folder, where it says it is parked)",
    ),
    "spare_taken": (
        ("slot", "pid", "rank", "warm_s"),
        "a spare took a failed rank's place in this generation instead of a new process "
        "(warm_s: how long it had been started; parked: it was waiting in the function, "
        "else still in its start-up)",
    ),
    "spares_off": (
        ("slot", "message"),
        "this node starts no more spares: one ended on its own before it reached "
        "rtrain.repairable (its error file's message)",
    ),
    "repair_fallback": (
        ("from_generation", "at_generation", "by_node", "failed_generations"),
        "this node stops repairing in place for the rest of the job: the job's repairs of "
        "failed_generations failed (a worker asked to park was stopped), the last of "
        "from_generation, counted by node by_node; read when at_generation ended (its "
        "workers restart as without repair in place from then on)",
    ),
    "replication": (
        ("replicas", "sent_bytes", "full_bytes", "seconds"),
        "replicas this node sent to peers since the last such event: count, bytes sent, "
        "bytes the whole shards hold, seconds spent sending",
    ),
    "snapshot_interval": (
        ("rank", "step", "interval", "previous", "replicate_s"),
        "the snapshot interval changed (every interval-th step is kept): replication "
        "fell behind (or caught up again), so fewer (or more) steps are kept instead of "
        "stalling each step; with scope job (the agents' agreement), the interval "
        "every rank keeps from step `step` on (wanted: what this node's ranks want); "
        "without scope, one rank's own (no agents' schedule), step: the first shard "
        "written at it; replicate_s: how long the agent took to replicate the shard "
        "before it",
    ),
    "gpu": (
        ("verdict", "findings"),
        "a GPU check: verdict (ok, warning, critical, unknown) and its findings",
    ),
    "charge": (
        ("host", "why", "from_generation", "failures"),
        "a node was charged a failure toward --max-node-failures, once: host, why (lost, "
        "or root cause), the generation that failed, and the failures it was charged so "
        "far (at the limit it is excluded); emitted by the agent that charged it",
    ),
    "fault_history": (
        ("host", "kind", "faults", "standby"),
        "a charged fault went into the nodes' fault history: host, kind, its faults within "
        "--fault-window (this one included), and whether that makes it a standby "
        "(--standby-after-faults); kept_in: the history file, or store",
    ),
    "standby_by_history": (
        ("host", "faults", "round"),
        "a round's closer left a joiner as a standby for its fault history, others could "
        "take its place: host, its faults in the window, the round",
    ),
    "slurm_exclude": (
        ("exclude", "hosts"),
        "under Slurm, the hostlist to pass to the next submission's `sbatch --exclude=`: "
        "the job's nodes its fault history makes standbys",
    ),
    "net_probe": (
        ("interface", "address", "peer", "rate_mbps"),
        "this node's state network (replicas, restores): the interface and address the "
        "shard server uses, the peer a small transfer went to and its rate in Mbit/s; "
        "link_mbps: the speed the interface reports (null: none, as on loopback); "
        "warnings: a rate far below it, a faster interface on the host",
    ),
    "job_end": (("exit_code", "message"), "the agent's end: its exit code and why"),
}


# The type of each field readers compute with: a line whose field has another type is
# not an event (a forged or garbled file must not crash `rtrain report`).
NUMBER, INTEGER, TEXT, LIST = "number", "integer", "text", "list"
FIELD_TYPES: dict[str, tuple[str, bool]] = {  # field -> (type, may be null)
    "nproc": (INTEGER, False),
    "max_restarts": (INTEGER, False),
    "nodes": (INTEGER, False),
    "world_size": (INTEGER, False),
    "members": (LIST, False),
    "restored_step": (INTEGER, True),
    "step": (INTEGER, True),
    "local": (INTEGER, False),
    "fetched": (INTEGER, False),
    "shards": (INTEGER, False),
    "failed": (INTEGER, False),
    "from_dp_peer": (INTEGER, False),
    "seconds": (NUMBER, False),
    "kind": (TEXT, False),
    "rank": (INTEGER, True),
    "fault_node": (INTEGER, True),
    "host": (TEXT, False),
    "fault_t": (NUMBER, False),
    "detect_s": (NUMBER, True),
    "warm_up_wait_s": (NUMBER, False),
    "message": (TEXT, False),
    "outcome": (TEXT, False),
    "last_step": (INTEGER, True),
    "reached_step": (INTEGER, True),
    "from_generation": (INTEGER, True),
    "down_s": (NUMBER, False),
    "lost_steps": (INTEGER, False),
    "at_step": (INTEGER, True),
    "replicas": (INTEGER, False),
    "interval": (INTEGER, False),
    "previous": (INTEGER, False),
    "replicate_s": (NUMBER, False),
    "sent_bytes": (NUMBER, False),
    "full_bytes": (NUMBER, False),
    "verdict": (TEXT, False),
    "findings": (LIST, False),
    "kept": (LIST, False),
    "restarted": (LIST, False),
    "fallback": (LIST, False),
    "at_generation": (INTEGER, False),
    "by_node": (INTEGER, False),
    "failed_generations": (LIST, False),
    "exit_code": (INTEGER, False),
    "why": (TEXT, False),
    "failures": (INTEGER, False),
    "faults": (INTEGER, False),
    "rate_mbps": (NUMBER, False),
    "link_mbps": (NUMBER, True),
    "slower": (NUMBER, False),
    "since": (NUMBER, False),
    "slow_s": (NUMBER, False),
}


def _typed(value: Any, kind: str, nullable: bool) -> bool:
    if value is None:
        return nullable
    if isinstance(value, bool):
        return False
    if kind == INTEGER:
        return isinstance(value, int)
    if kind == NUMBER:
        return isinstance(value, (int, float)) and math.isfinite(value)
    if kind == TEXT:
        return isinstance(value, str)
    return isinstance(value, list)


class EventError(ValueError):
    """An event rtrain would not write: unknown, a required field missing, not JSON."""


@dataclass(frozen=True)
class Event:
    name: str
    t: float
    agent: str
    node: int | None
    generation: int | None
    fields: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def event_line(
    name: str,
    t: float,
    agent: str,
    node: int | None,
    generation: int | None,
    fields: Mapping[str, Any],
) -> str:
    """One line of events.jsonl (with its newline); EventError if it breaks the schema."""
    if name not in SCHEMA:
        raise EventError(f"unknown event {name!r}")
    missing = [f for f in SCHEMA[name][0] if f not in fields]
    if missing:
        raise EventError(f"event {name!r} lacks {', '.join(missing)}")
    mistyped = [k for k, v in fields.items() if k in FIELD_TYPES and not _typed(v, *FIELD_TYPES[k])]
    if mistyped:
        raise EventError(f"event {name!r}: {', '.join(mistyped)} of the wrong type")
    clash = [f for f in fields if f in ENVELOPE]
    if clash:
        raise EventError(f"event {name!r} sets envelope fields {clash}")
    record = {
        "v": EVENTS_VERSION,
        "event": name,
        "t": round(t, 6),
        "agent": agent,
        "node": node,
        "generation": generation,
        **fields,
    }
    try:
        return json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
    except (TypeError, ValueError) as exc:
        raise EventError(f"event {name!r} is not plain JSON: {exc}") from None


def parse_event(line: str) -> Event | None:
    """An events.jsonl line, or None for one that is not a version-1 rtrain event
    (a torn last line, another version, garbage)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("v") != EVENTS_VERSION:
        return None
    name, t, agent = record.get("event"), record.get("t"), record.get("agent")
    node, generation = record.get("node"), record.get("generation")
    if not isinstance(name, str) or name not in SCHEMA or not isinstance(agent, str):
        return None
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        return None
    if not all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (node, generation)
    ):
        return None
    fields = {k: v for k, v in record.items() if k not in ENVELOPE}
    if any(f not in fields for f in SCHEMA[name][0]):
        return None
    for key, value in fields.items():
        if key in FIELD_TYPES and not _typed(value, *FIELD_TYPES[key]):
            return None
    return Event(name, float(t), agent, node, generation, fields)


def read_events(lines: Iterable[str]) -> tuple[list[Event], int]:
    """(the events, in file order; how many lines were not events)."""
    events, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        event = parse_event(line)
        if event is None:
            bad += 1
        else:
            events.append(event)
    return events, bad
