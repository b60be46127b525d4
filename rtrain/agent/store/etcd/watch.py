"""KeyWatch: the latest values of a key, or of every key under a prefix, kept in memory
by an etcd watch, so that what the agent checks many times a second (the round
counter, the abort record, its peers' leases) costs no store traffic.

A thread holds one streaming /v3/watch request, on the member its client and the
client's copies use now (members.Members). It reads a snapshot first (a range,
which gives the revision), then every change after that revision. A stream quiet for
idle_s is reopened on that member; one that fails (the member died, restarted, or did
not answer the watch's creation within idle_s) leaves the member, and the watch
resumes on the next one from the revision it had, so no change is missed; a compacted
revision takes a fresh snapshot. A member that any copy of the client left (the lease
keeper, renewing every heartbeat interval, finds a frozen one within a quarter of the
lease) closes the watches on it at once, so a frozen member, which accepts
connections and answers nothing, costs a watch no more than it costs the keeper.
Every event is validated JSON; one that is not is dropped with a log line, and the
watch restarts.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
from typing import Any

from ....core.errors import RendezvousError, first_line
from .client import EtcdClient, end_stream
from .wire import NotEtcd, apply_events, b64, int_field, prefix_end, revision, unb64

logger = logging.getLogger(__name__)

# A stream quiet for this long is reopened: the cost of noticing a frozen member.
WATCH_IDLE_S = 5.0
MAX_EVENT_BYTES = 16 << 20
RESTART_PAUSE_S = 0.2


class _Quiet(Exception):
    """The stream had nothing for idle_s (its member answered the creation)."""


class KeyWatch:
    def __init__(
        self, client: EtcdClient, key: str, prefix: bool = False, idle_s: float = WATCH_IDLE_S
    ) -> None:
        """Takes the first snapshot before it returns (errors pass to the caller)."""
        self.key = key
        self._prefix = prefix
        self._client = client.copy()
        self._idle_s = idle_s
        self._values: dict[str, bytes] = {}
        self._revision = 0
        self._closed = threading.Event()
        self._changed = threading.Condition()
        self._connection: http.client.HTTPConnection | None = None
        self._snapshot()
        self._thread = threading.Thread(target=self._run, name="rtrain-etcd-watch", daemon=True)
        self._thread.start()

    # -- readers --

    def value(self, key: str | None = None) -> bytes | None:
        return self._values.get(self.key if key is None else key)

    def items(self) -> dict[str, bytes]:
        return dict(self._values)

    def wait_change(self, timeout: float) -> None:
        """Block until the next change or timeout (for tests and waits)."""
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        self._kick()
        self._client.close()

    def _kick(self) -> None:
        """End the stream now (another thread: closing, or its member was left)."""
        end_stream(self._connection)

    # -- the thread --

    def _snapshot(self) -> None:
        answer = self._client.range(self.key, prefix=self._prefix)
        values: dict[str, bytes] = {}
        kvs = answer.get("kvs", [])
        if not isinstance(kvs, list):
            raise NotEtcd("etcd's range answer has no list of kvs")
        for kv in kvs:
            if not isinstance(kv, dict):
                raise NotEtcd("etcd's range answer holds a kv that is not an object")
            values[unb64(kv.get("key"), "a key").decode("utf-8", "replace")] = unb64(
                kv.get("value", ""), "a value"
            )
        self._values = values
        self._revision = revision(answer)
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _run(self) -> None:
        resync = False
        while not self._closed.is_set():
            index = self._client.current
            try:
                if resync:
                    self._snapshot()
                resync = self._stream(index)
            except _Quiet:
                continue  # nothing changed for idle_s: reopen on the same member
            except (RendezvousError, OSError, http.client.HTTPException, ssl.SSLError) as exc:
                if self._closed.is_set():
                    return
                logger.debug("watch of %s restarts: %s", self.key, first_line(exc, 100))
                self._client.leave(index)
                self._closed.wait(RESTART_PAUSE_S)
            finally:
                self._client.members.unwatch(index, self._kick)
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

    def _stream(self, index: int) -> bool:
        """Follow changes until the stream goes quiet or ends; True if a snapshot is due."""
        create: dict[str, Any] = {
            "key": b64(self.key),
            "start_revision": str(self._revision + 1),
        }
        if self._prefix:
            create["range_end"] = b64(prefix_end(self.key.encode()))
        connection = self._client.connect(index, self._idle_s)
        self._connection = connection
        connection.connect()
        if not self._client.members.watch(index, self._kick):
            return False  # the member was left while this one connected: reopen
        connection.request(
            "POST",
            "/v3/watch",
            json.dumps({"create_request": create}).encode(),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        if response.status != 200:
            raise RendezvousError(f"etcd refused a watch (HTTP {response.status})")
        created = False
        while not self._closed.is_set():
            try:
                line = response.readline(MAX_EVENT_BYTES)
            except TimeoutError:
                if not created:
                    raise  # the member did not answer the watch's creation: leave it
                raise _Quiet() from None
            created = True
            if not line:
                return False
            try:
                message = json.loads(line)
            except ValueError:
                raise NotEtcd("a watch event that is not JSON") from None
            result = message.get("result") if isinstance(message, dict) else None
            if not isinstance(result, dict):
                raise NotEtcd("a watch message without a result")
            if int_field(result, "compact_revision") or result.get("canceled"):
                return True
            self._apply(result.get("events", []))
        return False

    def _apply(self, events: object) -> None:
        self._revision = max(self._revision, apply_events(self._values, events))
        if events:
            self._notify()
