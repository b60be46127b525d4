"""What a repairable worker and its agent say to each other: three small JSON files in
the worker's own control folder ($RTRAIN_REPAIR_DIR), each written whole (a temporary
file renamed over it), so a reader sees the old content or the new, never a part.

  state.json    worker -> agent   {"state": "running"|"parked"|"stuck", "generation": g,
                "pid": p, "group": "whole"|"interim"}
                running: the worker opted in and trains in generation g; parked: it left
                generation g (its group released and destroyed) and waits, alive, for
                the next one (the acknowledgement of a request); stuck: asked to park,
                it released its group, and its training thread still waits, idle, in
                generation g (gloo's limit, core/worker/repair/group.py): the agent
                restarts it now rather than after its wait for the answer. group: the
                generation's whole group, or (train-through) the kept ranks' interim one
                while new ranks start up (core/worker/repair/through.py).
  request.json  agent -> worker   {"generation": g}: leave generation g and park.
  resume.json   agent -> worker   {"generation": g2, "pid": p, "env": {...}}: the
                process p (and no other: a hand-over names the process it is for) enters
                generation g2 with this environment (RANK, WORLD_SIZE, MASTER_ADDR, ...
                as a new worker of g2 gets at its start).

Pure: the names and the checked decoding; the files are read and written by the two
sides (core/worker/repair/repairable.py, agent/repair/control.py). Nothing is unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The worker's control folder; set by the agent for every worker, so a script opts in
# by calling rtrain.repairable, not by any flag.
REPAIR_DIR = "RTRAIN_REPAIR_DIR"
# How long a worker whose collective broke waits for the agent's request (seconds).
REPAIR_WAIT = "RTRAIN_REPAIR_WAIT_S"
# How long a parked worker waits for the next generation before it gives up (seconds).
RESUME_WAIT = "RTRAIN_REPAIR_RESUME_S"

STATE_FILE = "state.json"
REQUEST_FILE = "request.json"
RESUME_FILE = "resume.json"

RUNNING, PARKED, STUCK = "running", "parked", "stuck"
WHOLE, INTERIM = "whole", "interim"
MAX_BYTES = 1 << 20  # a control file is a few hundred bytes; a larger one is refused


@dataclass(frozen=True)
class WorkerState:
    state: str
    generation: int
    pid: int
    group: str = WHOLE


@dataclass(frozen=True)
class Resume:
    generation: int
    pid: int  # the process the hand-over is for
    env: dict[str, str]


def encode_state(state: WorkerState) -> bytes:
    return json.dumps(
        {
            "state": state.state,
            "generation": state.generation,
            "pid": state.pid,
            "group": state.group,
        }
    ).encode()


def encode_request(generation: int) -> bytes:
    return json.dumps({"generation": generation}).encode()


def encode_resume(resume: Resume) -> bytes:
    return json.dumps(
        {"generation": resume.generation, "pid": resume.pid, "env": resume.env}
    ).encode()


def _object(data: bytes | None) -> dict[str, Any] | None:
    if data is None or len(data) > MAX_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_state(data: bytes | None) -> WorkerState | None:
    found = _object(data)
    if found is None or found.get("state") not in (RUNNING, PARKED, STUCK):
        return None
    generation, pid = _integer(found.get("generation")), _integer(found.get("pid"))
    group = found.get("group", WHOLE)
    if generation is None or pid is None or group not in (WHOLE, INTERIM):
        return None
    return WorkerState(str(found["state"]), generation, pid, str(group))


def decode_request(data: bytes | None) -> int | None:
    found = _object(data)
    return None if found is None else _integer(found.get("generation"))


def decode_resume(data: bytes | None) -> Resume | None:
    found = _object(data)
    if found is None:
        return None
    generation, pid, env = (
        _integer(found.get("generation")),
        _integer(found.get("pid")),
        found.get("env"),
    )
    if generation is None or pid is None or not isinstance(env, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return Resume(generation, pid, dict(env))
