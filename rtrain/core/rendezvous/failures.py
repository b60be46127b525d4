"""Failure records: what failed, where, in which generation, and which one came first."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from .protocol import json_object


class FailureKind(str, Enum):
    """What failed. The value is what failure records carry on the wire and on disk."""

    EXIT = "exit"  # a worker exited non-zero
    SIGNAL = "signal"  # a worker died of a signal
    HANG = "hang"  # a worker stopped heartbeating and was killed
    LOST_NODE = "lost_node"  # a peer agent's lease expired
    UNHEALTHY_GPU = "unhealthy_gpu"  # a GPU failed its checks
    SLOW_NODE = "slow_node"  # a rank slow for --replace-stragglers-after: its node left
    AGENT = "agent"  # the agent itself could not go on
    # A worker the agent stopped after another's failure. It appears only in the final
    # failure report of the node that gives up, as torchrun lists every rank that ended
    # non-zero; it is never written to the store, so it is never charged.
    STOPPED = "stopped"

    __str__ = str.__str__  # the wire value, in messages too


FAILURE_KINDS: tuple[str, ...] = tuple(kind.value for kind in FailureKind)


class RecordError(ValueError):
    """A record read from the store or an error file that does not have the expected shape."""


@dataclass(frozen=True)
class FailureRecord:
    kind: FailureKind
    generation: int
    node_rank: int
    host: str
    time: float
    local_rank: int | None = None
    rank: int | None = None
    pid: int | None = None
    exitcode: int | None = None
    message: str = ""
    traceback: str = ""
    error_file: str = ""

    def __post_init__(self) -> None:
        # A kind given as its wire value ("exit") is held as the enum member.
        object.__setattr__(self, "kind", FailureKind(self.kind))

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe_exit(self) -> str:
        name = self.signal_name
        if name is not None:
            return f"{name} ({self.exitcode})"
        return "" if self.exitcode is None else str(self.exitcode)

    def summary(self) -> str:
        """What went wrong, in one line: the error's message, or how the process ended."""
        if self.message:
            return self.message
        if self.kind == FailureKind.EXIT and self.exitcode is not None:
            return (
                f"exit {self.exitcode}: no Python exception "
                f"(sys.exit({self.exitcode}) or os._exit({self.exitcode}))"
            )
        if self.kind == FailureKind.SIGNAL and self.signal_name is not None:
            return f"killed by {self.signal_name}"
        if self.kind == FailureKind.STOPPED:
            how = self.signal_name or f"exit {self.exitcode}"
            return f"stopped by rtrain after the failure above ({how})"
        return self.kind.value.replace("_", " ")

    def encode(self) -> str:
        return json.dumps({**asdict(self), "kind": self.kind.value}, sort_keys=True)

    @classmethod
    def decode(cls, payload: bytes | str) -> FailureRecord:
        data = json_object(payload, "failure record", RecordError)
        try:
            kind = data["kind"]
            if kind not in FAILURE_KINDS:
                raise RecordError(f"failure record: unknown kind {kind!r}")
            return cls(
                kind=FailureKind(kind),
                generation=_int(data, "generation"),
                node_rank=_int(data, "node_rank"),
                host=str(data["host"]),
                time=float(data["time"]),
                local_rank=_opt_int(data, "local_rank"),
                rank=_opt_int(data, "rank"),
                pid=_opt_int(data, "pid"),
                exitcode=_opt_int(data, "exitcode"),
                message=str(data.get("message", "")),
                traceback=str(data.get("traceback", "")),
                error_file=str(data.get("error_file", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"failure record: malformed ({exc})") from None


# What a worker dies of when a *peer* went away in the middle of a collective. A worker
# that exits on its own can take longer to be reaped (interpreter shutdown) than its
# peers take to fail, so time alone would blame a victim. The last two are the agent's
# own words for a hung worker found waiting in a collective, or exiting after a
# collective error (agent/workers/hang_watch.py).
VICTIM_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "connectFullMesh",
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistBackendError",
    "/gloo/transport/",  # every gloo transport error names its source file
    "waiting in a collective",
    "likely a victim of another rank",
)


def is_collective_error(text: str) -> bool:
    """The text of an error (its message, its traceback) says a collective broke under it."""
    return any(marker in text for marker in VICTIM_MARKERS)


def is_collective_victim(record: FailureRecord) -> bool:
    """A consequence, not a cause: the worker's collective broke because a peer failed."""
    return is_collective_error(f"{record.message}\n{record.traceback[-2000:]}")


def failure_roles(records: list[FailureRecord]) -> list[str]:
    """Each record's part in its generation's failure, in the order given: "root cause"
    (the first of root_cause_first among its generation's records), "victim" (a rank
    whose collective broke under it: a consequence), or "" (another failure of its own,
    or a worker rtrain stopped)."""
    roots: dict[int, FailureRecord] = {}
    for record in root_cause_first(records):
        roots.setdefault(record.generation, record)
    return [
        "root cause"
        if roots[r.generation] is r
        else "victim"
        if r.kind != FailureKind.STOPPED and is_collective_victim(r)
        else ""
        for r in records
    ]


def root_cause_first(records: list[FailureRecord]) -> list[FailureRecord]:
    """The likely cause first: failures that are not a peer's collective breaking under
    it, earliest first; then the victims, earliest first; then the workers rtrain
    stopped."""
    return sorted(
        records,
        key=lambda r: (
            r.kind == FailureKind.STOPPED,
            is_collective_victim(r),
            r.time,
            r.node_rank,
            r.rank if r.rank is not None else -1,
        ),
    )


@dataclass(frozen=True)
class ErrorFileContent:
    message: str
    traceback: str
    timestamp: float | None


def parse_error_file(payload: str) -> ErrorFileContent:
    """Read torch's `@record` error file format (also what rtrain's workers write)."""
    data = json_object(payload, "error file", RecordError)
    message = data.get("message")
    if isinstance(message, str):
        return ErrorFileContent(message=message, traceback="", timestamp=None)
    if not isinstance(message, dict):
        raise RecordError("error file: 'message' is neither text nor an object")
    extra = message.get("extraInfo") or {}
    stamp = extra.get("timestamp")
    try:
        timestamp = float(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        timestamp = None
    return ErrorFileContent(
        message=str(message.get("message", "")),
        traceback=str(extra.get("py_callstack", "")),
        timestamp=timestamp,
    )


def error_file_payload(message: str, traceback: str, timestamp: float) -> str:
    return json.dumps(
        {
            "message": {
                "message": message,
                "extraInfo": {"py_callstack": traceback, "timestamp": str(int(timestamp))},
            }
        }
    )


def _int(data: dict[str, Any], key: str) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{key} must be an integer, got {value!r}")
    return value


def _opt_int(data: dict[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else _int(data, key)
