"""EtcdClient: etcd's v3 API through its JSON gateway, on the standard library alone.

Why not a client package: `etcd3` (0.12) imports generated protobuf code that current
protobuf (the one torch brings) refuses; `aetcd` is asyncio over grpcio, a large native
dependency whose versions are pinned against protobuf too; `etcd3gw` talks to the same
JSON gateway as this module but through requests with one timeout for everything, no
failover between members and no way to be interrupted. Every etcd 3.4+ server has the
gateway (/v3/...), so a small client owns what rtrain needs: a bounded wait per request,
failover between members, a deadline for the whole call, TLS, and validation of every
answer (an endpoint that is not etcd is named, never trusted). Nothing is unpickled:
answers are JSON, and keys and values base64 inside it.

A call tries the members in turn, each for first_attempt_s (attempt_s unless limited);
while none answers (quorum lost, all down, or all slow on a loaded machine) it tries
them again, each pass waiting twice as long on a member up to attempt_s, until
deadline_s, calling interrupt() between passes so that the agent still sees its
signals, then raises StoreUnavailable naming every endpoint.

A client and its copies (one per thread: the lease keeper, each watch) share one
Members: the member they all use, which a node picks by its address (first_member), so
that the nodes of a job start spread over the members rather than all on the first.
A member that fails one of them (refused, timed out, no quorum) is left by all of them
at once: the others' next calls go elsewhere and the watches on it reopen elsewhere. A
frozen member (SIGSTOPped, or a machine that hangs) still accepts connections and
answers nothing, so only the attempt's timeout finds it: the agent bounds the first
pass's wait to a quarter of its lease (etcd_leases.py), and its keeper, renewing every heartbeat
interval, is the probe that finds a frozen member for every client of the node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ....core.clock import Clock
from ....core.errors import RendezvousError, StoreUnavailable, first_line
from ...waiting import SYSTEM_CLOCK
from .members import Members
from .wire import (
    MAX_ANSWER_BYTES,
    EtcdTls,
    LeaseNotFound,
    NotEtcd,
    b64,
    int_field,
    json_object,
    prefix_end,
)

logger = logging.getLogger(__name__)

# gRPC codes etcd answers with that mean "another member, or later, may succeed".
# (2, unknown, is how the gateway passes on "context deadline exceeded" without quorum.)
RETRYABLE_CODES = {1, 2, 4, 14}  # cancelled, unknown, deadline exceeded, unavailable
NOT_FOUND = 5  # "requested lease not found"
RETRY_PAUSES_S = (0.05, 0.1, 0.2, 0.5)


class _Unanswered(Exception):
    """This member did not answer usefully; try the next one."""


class EtcdClient:
    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        tls: EtcdTls | None = None,
        attempt_s: float = 2.0,
        deadline_s: float = 60.0,
        interrupt: Callable[[], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        members: Members | None = None,
        first_attempt_s: float | None = None,
    ) -> None:
        """members: shared with the client this one copies; a new client starts on the
        first endpoint unless given Members(len(endpoints), first_member(...))."""
        if not endpoints:
            raise RendezvousError("etcd: no endpoints")
        self.endpoints = list(endpoints)
        self.endpoint = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        self.tls = tls
        self.attempt_s = attempt_s
        self.first_attempt_s = attempt_s if first_attempt_s is None else first_attempt_s
        self.deadline_s = deadline_s
        self.interrupt = interrupt
        self._clock = clock
        self._ssl = tls.context() if tls is not None else None
        self.members = members if members is not None else Members(len(self.endpoints))
        self._connection: http.client.HTTPConnection | None = None
        self._connected_to = -1
        self._lock = threading.Lock()
        self._outage_logged = False

    def copy(self) -> EtcdClient:
        """A client of its own (its own connection), for another thread; it uses the same
        member as this one, and leaves a failed member with it."""
        return EtcdClient(
            self.endpoints,
            self.tls,
            self.attempt_s,
            self.deadline_s,
            None,
            self._clock,
            self.members,
            self.first_attempt_s,
        )

    def limit_attempts(self, seconds: float) -> None:
        """Wait at most this long for one member before trying the next, while another
        may answer (the first pass over the members; copies made after this inherit it)."""
        self.first_attempt_s = min(self.first_attempt_s, seconds)

    # -- transport --

    @property
    def current(self) -> int:
        """The member this client and its copies use now."""
        return self.members.current

    def leave(self, index: int) -> None:
        """index did not answer: this client and its copies move to the next member."""
        self.members.leave(index)

    def connect(self, index: int, timeout: float | None) -> http.client.HTTPConnection:
        host, port = self.endpoints[index]
        if self._ssl is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST body to /v3/<path> on some member; its JSON answer."""
        payload = json.dumps(body).encode()
        deadline = self._clock.now() + self.deadline_s
        reasons: dict[str, str] = {}
        pause = 0
        with self._lock:
            while True:
                for _ in range(len(self.endpoints)):
                    index = self.members.current
                    wait = min(self.attempt_s, self.first_attempt_s * 2**pause)
                    try:
                        answer = self._attempt(index, path, payload, wait)
                    except _Unanswered as exc:
                        reasons[self._name(index)] = str(exc)
                        self._drop_connection()
                        self.members.leave(index)
                        continue
                    if self._outage_logged:
                        logger.warning("etcd answers again (%s)", self._name(index))
                        self._outage_logged = False
                    return answer
                if all(r.startswith("not etcd") for r in reasons.values()):
                    raise NotEtcd(
                        f"no etcd v3 server at --rdzv-endpoint={self.endpoint}: "
                        + "; ".join(f"{k} {v}" for k, v in reasons.items())
                    )
                if self._clock.now() >= deadline:
                    raise StoreUnavailable(
                        f"etcd unavailable: none of {self.endpoint} answered within "
                        f"{self.deadline_s:g}s (quorum lost or every member down; "
                        + "; ".join(f"{k}: {v}" for k, v in reasons.items())
                        + ")"
                    )
                if not self._outage_logged:
                    logger.warning(
                        "no etcd member answers (%s); retrying for up to %gs",
                        "; ".join(f"{k}: {v}" for k, v in reasons.items()),
                        self.deadline_s,
                    )
                    self._outage_logged = True
                if self.interrupt is not None:
                    self.interrupt()
                self._clock.sleep(RETRY_PAUSES_S[min(pause, len(RETRY_PAUSES_S) - 1)])
                pause += 1

    def _name(self, index: int) -> str:
        host, port = self.endpoints[index]
        return f"{host}:{port}"

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._connected_to = -1

    def _attempt(self, index: int, path: str, payload: bytes, wait: float) -> dict[str, Any]:
        if self._connected_to != index:  # a copy left the member this one was on
            self._drop_connection()
        try:
            if self._connection is None:
                self._connection = self.connect(index, wait)
                self._connected_to = index
            connection = self._connection
            connection.timeout = wait
            if connection.sock is not None:
                connection.sock.settimeout(wait)
            connection.request("POST", f"/v3/{path}", payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read(MAX_ANSWER_BYTES + 1)
            status = response.status
        except http.client.RemoteDisconnected:
            raise _Unanswered("closed the connection") from None
        except http.client.BadStatusLine:
            raise _Unanswered("not etcd (does not speak HTTP)") from None
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            reason = "timed out" if isinstance(exc, socket.timeout) else first_line(exc, 80)
            raise _Unanswered(reason or type(exc).__name__) from None
        answer = json_object(raw)
        if answer is None:
            raise _Unanswered(f"not etcd (HTTP {status}, not a JSON object)")
        if status == 200:
            return answer
        code = answer.get("code")
        message = str(answer.get("message") or answer.get("error") or f"HTTP {status}")[:200]
        if code == NOT_FOUND and "lease" in message:
            raise LeaseNotFound(message)
        if code in RETRYABLE_CODES or status == 503:
            raise _Unanswered(message)
        if code is None:
            raise _Unanswered(f"not etcd (HTTP {status} without a gRPC code)")
        raise RendezvousError(f"etcd refused /v3/{path}: {message}")

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    # -- the operations rtrain uses --

    def range(
        self,
        key: str,
        prefix: bool = False,
        keys_only: bool = False,
        limit: int = 0,
        revision: int = 0,
    ) -> dict[str, Any]:
        """revision: the key as it was at that revision (0: now)."""
        body: dict[str, Any] = {"key": b64(key)}
        if revision:
            body["revision"] = str(revision)
        if prefix:
            body["range_end"] = b64(prefix_end(key.encode()))
        if keys_only:
            body["keys_only"] = True
        if limit:
            body["limit"] = limit
        return self.call("kv/range", body)

    def put(self, key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return self.call("kv/put", body)

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]],
    ) -> dict[str, Any]:
        return self.call("kv/txn", {"compare": compare, "success": success, "failure": failure})

    def delete(self, key: str) -> int:
        return int_field(self.call("kv/deleterange", {"key": b64(key)}), "deleted")

    def grant(self, ttl: int) -> int:
        answer = self.call("lease/grant", {"TTL": ttl})
        lease = int_field(answer, "ID")
        if lease <= 0:
            raise NotEtcd(f"etcd at {self.endpoint} granted no lease")
        return lease

    def keepalive(self, lease: int) -> int:
        """The lease's TTL after renewal; 0 once etcd no longer has the lease."""
        answer = self.call("lease/keepalive", {"ID": str(lease)})
        result = answer.get("result")
        if not isinstance(result, dict):
            raise NotEtcd("etcd's keepalive answer has no result")
        return int_field(result, "TTL")

    def revoke(self, lease: int) -> None:
        with contextlib.suppress(LeaseNotFound):
            self.call("lease/revoke", {"ID": str(lease)})


def end_stream(connection: http.client.HTTPConnection | None) -> None:
    """End a watch's stream now, from another thread (closing, a new target, a member
    left): shut its socket down, which its reader sees at once; closing is the reader's."""
    if connection is not None and connection.sock is not None:
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)
