"""JobWatch: every key (or prefix) one agent follows over etcd, on one watch stream.

A KeyWatch per key was a long-lived HTTP stream through etcd's JSON gateway each, and an
agent followed five or six keys a generation (the news, the round's closed key, the
abort record, the leases), each opened again every generation: at 256 simulated agents
the members' gateways took both cores. Here one stream carries a watch per target:
the gateway passes every create_request of the request's body to etcd's Watch (one
gRPC stream), and each event comes back tagged with its watch_id.

Every (re)start of the stream first reads every target in one transaction (a
snapshot, at one revision R) and then creates each target's watch from R + 1, so
what happened while no stream was open is in the snapshot, and nothing after it is
missed. A start happens when a target is added, when the stream ends or fails (its
member is left, as KeyWatch does), when it was quiet for idle_s, and when etcd
answers that the revision was compacted or cancels a watch. So an event the stream
lost, a stream cut mid-generation and a compacted revision each cost one read and
never a change: the read brings it.

The gateway reads the request's body while it answers: the first 512 bytes are read
before anything is sent back, the rest may be cut off once the answer starts (Go's
HTTP server discards an unread body). Each create is counted back ("created"), and a
stream that created fewer than it asked for is started again (`short_starts`).

Targets not read for EVICT_S are dropped at the next start; at most MAX_TARGETS are
kept (the least recently read go first).
"""

from __future__ import annotations

import collections
import http.client
import json
import logging
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from ....core.clock import Clock
from ....core.errors import RendezvousError, first_line
from ...waiting import SYSTEM_CLOCK
from .client import EtcdClient, end_stream
from .watch import MAX_EVENT_BYTES, RESTART_PAUSE_S
from .wire import NotEtcd, apply_events, b64, int_field, prefix_end, revision, unb64

logger = logging.getLogger(__name__)

# Quiet this long, the stream is started again (a read of every target): the backstop
# for a member that stopped answering unnoticed (the lease keeper's leave() closes it
# sooner), and for an event a stream lost.
JOB_WATCH_IDLE_S = 10.0
EVICT_S = 30.0
MAX_TARGETS = 12
CREATE_WAIT_S = 2.0  # every create must be answered within this (else start again)
# A new target restarts the stream after this, so that the targets a caller adds one
# after another (a generation's news, closed key and peers' leases) share one start.
ADD_SETTLE_S = 0.05


class _Restart(Exception):
    """Start the stream again (a target added, quiet, compacted, or fewer created)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Target:
    key: str
    prefix: bool
    values: dict[str, bytes] = field(default_factory=dict)
    read_at: float = 0.0


class JobWatch:
    def __init__(
        self,
        client: EtcdClient,
        idle_s: float = JOB_WATCH_IDLE_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """clock: when a target was last read (one unread for EVICT_S is dropped)."""
        self._client = client.copy()
        self._idle_s = idle_s
        self._clock = clock
        self._targets: dict[tuple[str, bool], Target] = {}
        self._streamed: list[Target] = []  # the stream's watches, by watch_id
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._added = threading.Event()
        self._connection: http.client.HTTPConnection | None = None
        self.starts = 0
        self.short_starts = 0
        self.restarts: collections.Counter[str] = collections.Counter()  # by reason
        self._thread: threading.Thread | None = None

    # -- readers --

    def target(self, key: str, prefix: bool = False) -> Target:
        """The target of key (or of every key under it): read now if new (one range), and
        followed by the stream from its next start on."""
        name = (key, prefix)
        with self._lock:
            found = self._targets.get(name)
            if found is not None:
                found.read_at = self._clock.now()
                return found
        fresh = Target(key, prefix, _values(self._client.range(key, prefix=prefix)))
        fresh.read_at = self._clock.now()
        with self._lock:
            found = self._targets.setdefault(name, fresh)
            if found is fresh:
                self._trim()
        if found is fresh:
            self._added.set()
            self._kick()  # the stream starts again with it
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rtrain-etcd-job-watch", daemon=True
                )
                self._thread.start()
        return found

    def has(self, key: str, prefix: bool = False) -> bool:
        """Whether key is a target now."""
        with self._lock:
            return (key, prefix) in self._targets

    def value(self, key: str) -> bytes | None:
        return self.target(key).values.get(key)

    def items(self, key: str) -> dict[str, bytes]:
        """Every key under the prefix key, and its value."""
        return dict(self.target(key, prefix=True).values)

    def wait_change(self, timeout: float) -> None:
        """Block until the next change or timeout (for tests and waits)."""
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        self._added.set()
        self._kick()
        self._client.close()

    def _trim(self) -> None:
        """Drop the least recently read past MAX_TARGETS (under the lock)."""
        while len(self._targets) > MAX_TARGETS:
            oldest = min(self._targets, key=lambda name: self._targets[name].read_at)
            del self._targets[oldest]

    def _kick(self) -> None:
        """End the stream now (another thread: closing, a new target, a left member)."""
        end_stream(self._connection)

    # -- the thread --

    def _run(self) -> None:
        while not self._closed.is_set():
            index = self._client.current
            try:
                self._start(index)
            except _Restart as restart:
                self.restarts[restart.reason] += 1
                if restart.reason == "added":
                    self._closed.wait(ADD_SETTLE_S)
                continue
            except (RendezvousError, OSError, http.client.HTTPException, ssl.SSLError) as exc:
                if self._closed.is_set():
                    return
                self.restarts["added" if self._added.is_set() else "failed"] += 1
                if not self._added.is_set():  # not kicked for a new target: the member
                    logger.debug("the job's watch restarts: %s", first_line(exc, 100))
                    self._client.leave(index)
                    self._closed.wait(RESTART_PAUSE_S)
            finally:
                self._client.members.unwatch(index, self._kick)
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

    def _snapshot(self) -> tuple[list[Target], int]:
        """Every target still read, read again in one transaction: (targets, revision)."""
        now = self._clock.now()
        with self._lock:
            for name in [n for n, t in self._targets.items() if now - t.read_at > EVICT_S]:
                del self._targets[name]
            targets = list(self._targets.values())
        ranges = []
        for target in targets:
            read: dict[str, Any] = {"key": b64(target.key)}
            if target.prefix:
                read["range_end"] = b64(prefix_end(target.key.encode()))
            ranges.append({"request_range": read})
        answer = self._client.txn([], ranges, [])
        responses = answer.get("responses", [])
        if not isinstance(responses, list) or len(responses) != len(targets):
            raise NotEtcd("etcd's txn answer has not one response per range")
        for target, response in zip(targets, responses, strict=True):
            found = response.get("response_range") if isinstance(response, dict) else None
            if not isinstance(found, dict):
                raise NotEtcd("etcd's txn answer holds a response that is not a range")
            target.values = _values(found)
        self._notify()
        return targets, revision(answer)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _start(self, index: int) -> None:
        self._added.clear()
        targets, at = self._snapshot()
        if not targets:
            self._added.wait(self._idle_s)
            raise _Restart("idle")
        self.starts += 1
        body = b"".join(json.dumps(_create(t, at + 1)).encode() for t in targets)
        connection = self._client.connect(index, min(self._idle_s, CREATE_WAIT_S))
        self._connection = connection
        connection.connect()
        if not self._client.members.watch(index, self._kick) or self._added.is_set():
            raise _Restart("added")  # a target came, or the member was left, meanwhile
        connection.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RendezvousError(f"etcd refused a watch (HTTP {response.status})")
        self._streamed = []
        self._follow(response, targets, connection)

    def _follow(
        self,
        response: http.client.HTTPResponse,
        targets: list[Target],
        connection: http.client.HTTPConnection,
    ) -> None:
        by_id: dict[int, Target] = {}
        while not self._closed.is_set():
            try:
                line = response.readline(MAX_EVENT_BYTES)
            except TimeoutError:
                if len(by_id) < len(targets):
                    self.short_starts += 1  # a create went unanswered: start again
                    raise _Restart("short") from None
                raise _Restart("quiet") from None
            if not line:  # the stream ended (cut, or kicked for a new target)
                raise _Restart("added" if self._added.is_set() else "ended")
            if line.strip() == b"":
                continue
            result = _result(line)
            if int_field(result, "compact_revision") or result.get("canceled"):
                raise _Restart("compacted")
            watch_id = int_field(result, "watch_id")
            if result.get("created"):
                if len(by_id) < len(targets):
                    by_id[watch_id] = targets[len(by_id)]
                if len(by_id) == len(targets) and connection.sock is not None:
                    connection.sock.settimeout(self._idle_s)  # all created: quiet now
                continue
            target = by_id.get(watch_id)
            if target is not None:
                self._apply(target, result.get("events", []))

    def _apply(self, target: Target, events: object) -> None:
        apply_events(target.values, events)
        if events:
            self._notify()


def _create(target: Target, start: int) -> dict[str, Any]:
    create: dict[str, Any] = {"key": b64(target.key), "start_revision": str(start)}
    if target.prefix:
        create["range_end"] = b64(prefix_end(target.key.encode()))
    return {"create_request": create}


def _result(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        raise NotEtcd("a watch event that is not JSON") from None
    result = message.get("result") if isinstance(message, dict) else None
    if not isinstance(result, dict):
        raise NotEtcd("a watch message without a result")
    return result


def _values(answer: dict[str, Any]) -> dict[str, bytes]:
    kvs = answer.get("kvs", [])
    if not isinstance(kvs, list):
        raise NotEtcd("etcd's range answer has no list of kvs")
    values: dict[str, bytes] = {}
    for kv in kvs:
        if not isinstance(kv, dict):
            raise NotEtcd("etcd's range answer holds a kv that is not an object")
        key = unb64(kv.get("key"), "a key").decode("utf-8", "replace")
        values[key] = unb64(kv.get("value", ""), "a value")
    return values
