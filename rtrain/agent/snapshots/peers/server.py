"""ShardServer: agents hand each other shards over TCP, authenticated (wire.py).

An authenticated request is judged by core.snapshots.admission (who may put what, who
may get). Before authentication a connection costs a thread and a descriptor, so a
connection from an address that is no member's of the current generation is closed
at once, before any thread or handshake; from each member's address at most
MAX_UNAUTHENTICATED are open at once (MAX_UNAUTHENTICATED_TOTAL in all), and each must
finish the handshake within HANDSHAKE_S in all (not per read): a slow or flooding
client is cut off, and cannot take the places of the other members' connections.
Every kind of refusal, and every reason of a refused request, is logged once a minute
at most, each on its own line: a flood of one kind never hides another.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections import Counter
from typing import Any

from ....core.errors import RtrainError
from ....core.snapshots.admission import Admission, superseded_by
from ....core.snapshots.format import HEADER_SIZE
from ....core.snapshots.restore_plan import ShardId
from ...net.descriptors import is_out_of_descriptors, ran_out_in_thread
from ...net.limits import ConnectionPlaces, RateLimitedLog
from ..shard_store import ShardStore
from ..slot_check import fitting_header
from .delta import assemble, find_base, needed_chunks
from .wire import (
    HANDSHAKE_S,
    IO_TIMEOUT_S,
    MAGIC,
    NONCE,
    ShardError,
    mac,
    recv_exact,
    recv_into_range,
    recv_message,
    recv_verified,
    send_message,
)

logger = logging.getLogger(__name__)

MAX_UNAUTHENTICATED = 32  # per source address
MAX_UNAUTHENTICATED_TOTAL = 256


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        # Replies are small writes followed by reads: without this, Nagle's algorithm
        # and the peer's delayed ACK held each put 44 ms (0.3 ms with it, loopback).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = self.client_address[0]
        try:
            if not self._authenticate(sock, peer):
                return
            sock.settimeout(IO_TIMEOUT_S)
            while True:
                try:
                    request = recv_message(sock)
                except ShardError:
                    return
                if not self._serve(sock, request, peer):
                    return
        except (OSError, RtrainError) as exc:  # ShardError, a full /dev/shm: the peer retries
            if isinstance(exc, OSError) and is_out_of_descriptors(exc):  # the node's
                ran_out_in_thread(exc)
            line = f"failed/{type(exc).__name__}"
            self.server.refuse(
                "failed", "shard connection from %s failed: %s", peer, exc, line=line
            )

    def _authenticate(self, sock: socket.socket, peer: str) -> bool:
        secret = self.server.secret
        try:
            deadline = time.monotonic() + HANDSHAKE_S  # the socket's: the OS's clock
            sock.settimeout(HANDSHAKE_S)
            nonce = secrets.token_bytes(NONCE)
            sock.sendall(MAGIC + nonce)
            answer = recv_exact(sock, 32 + NONCE, deadline)
            if not hmac.compare_digest(answer[:32], mac(secret, b"client", nonce)):
                self.server.refuse(
                    "secret", "refused a shard client without the job secret (%s)", peer
                )
                return False
            sock.sendall(mac(secret, b"server", answer[32:]))
            return True
        except (OSError, ShardError) as exc:
            self.server.refuse("handshake", "shard client %s did not authenticate: %s", peer, exc)
            return False
        finally:
            self.server.authenticated(peer)

    def _serve(self, sock: socket.socket, request: dict[str, Any], peer: str) -> bool:
        """Answer one request; False: close the connection (a refused put's payload
        follows its header, so the stream cannot go on)."""
        store, admission = self.server.store, self.server.admission
        try:
            shard = ShardId(int(request["gen"]), int(request["rank"]), int(request["step"]))
        except (KeyError, TypeError, ValueError):
            send_message(sock, {"ok": False, "error": "malformed request"})
            return request.get("op") != "put"
        if request.get("op") == "put":
            try:
                size, crcs = int(request["size"]), [int(c) for c in request["crcs"]]
            except (KeyError, TypeError, ValueError):
                size = -1
            if size < HEADER_SIZE:
                send_message(sock, {"ok": False, "error": "malformed request"})
                return False
            kept = store.replica_steps(shard.generation, shard.rank)
            why = (
                None
                if admission is None
                else admission.refuse_put(peer, shard.generation, shard.step, kept)
            )
            if why is not None:
                self.server.refuse(
                    "put",
                    "refused a replica of %s from %s: %s",
                    shard,
                    peer,
                    why,
                    line=f"put/{why.reason.value}",
                )
                send_message(sock, {"ok": False, "error": f"refused: {why}"})
                return False
            if admission is not None:
                self._drop_unconfirmed(shard, kept, peer)
            with store.receive(shard, size) as (path, buffer):
                if "base" in request:
                    ok = self._against_base(sock, request["base"], buffer, size, crcs)
                else:
                    ok = recv_verified(sock, buffer, size) == crcs
                # Whole, and its header must fit it too (header_misfit): never kept else.
                head = bytes(buffer[:HEADER_SIZE])
                where = f"a replica of {shard} from {peer}"
                fits = ok and fitting_header(head, size, where) is not None
                if fits:
                    store.keep_replica(shard, path, size, crcs)
            if not ok:  # the sender checks its slot did not change: this is corruption
                self.server.refuse(
                    "mismatch", "a replica of %s from %s failed its checksum", shard, peer
                )
            elif not fits:
                self.server.refuse(
                    "corrupt", "refused a corrupt replica of %s from %s", shard, peer
                )
            error = "" if fits else "checksum mismatch" if not ok else "corrupt header"
            send_message(sock, {"ok": fits, "error": error})
            return True
        if request.get("op") == "get":
            why = None if admission is None else admission.refuse_get(peer)
            if why is not None:
                line = f"get/{why.reason.value}"
                self.server.refuse("get", "refused %s to %s: %s", shard, peer, why, line=line)
                send_message(sock, {"ok": False, "error": f"refused: {why}"})
                return True
            found = store.open_shard(shard)
            if found is None:
                send_message(sock, {"ok": False, "error": "not held"})
                return True
            buffer, size, crcs = found
            send_message(sock, {"ok": True, "size": size, "crcs": crcs}, memoryview(buffer)[:size])
            return True
        send_message(sock, {"ok": False, "error": "unknown op"})
        return True

    def _drop_unconfirmed(self, shard: ShardId, kept: list[int], peer: str) -> None:
        """Its sender is at shard.step: newer replicas of the rank kept here are ones it
        never confirmed (forged, or a confused peer's), and go."""
        stale = superseded_by(shard.step, kept)
        if stale:
            self.server.store.forget_replicas(shard.generation, shard.rank, stale)
            self.server.refuse(
                "unconfirmed",
                "dropped the replica of rank %d at step %s: its sender %s is at step %d",
                shard.rank,
                ", ".join(map(str, stale)),
                peer,
                shard.step,
            )

    def _against_base(
        self, sock: socket.socket, raw: Any, buffer: Any, size: int, crcs: list[int]
    ) -> bool:
        """Receive a replica as the chunks a shard held here lacks; whether it is whole."""
        head = recv_exact(sock, HEADER_SIZE)
        try:
            base_id = ShardId(*(int(v) for v in raw))
        except (TypeError, ValueError):
            base = None  # a malformed base: everything is needed
        else:
            base = find_base(self.server.store, base_id)
        need = needed_chunks(head, size, crcs, base)
        send_message(sock, {"need": need})
        return assemble(sock, buffer, head, size, need, base, recv_into_range) == crcs


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # A flood is refused by process_request, quickly, not left waiting in the kernel's
    # queue in front of the real peers.
    request_queue_size = 256

    def __init__(
        self, addr: tuple[str, int], secret: bytes, store: ShardStore, admission: Admission | None
    ) -> None:
        self.secret = secret
        self.store = store
        self.admission = admission
        self.refusals: Counter[str] = Counter()
        self._log = RateLimitedLog(logger)
        # Connections still authenticating, by source address.
        self._unauthenticated = ConnectionPlaces(MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED_TOTAL)
        super().__init__(addr, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Judged before a thread exists: a stranger or a flood costs no threads.
        source = str(client_address[0])
        why = None if self.admission is None else self.admission.refuse_connection(source)
        if why is not None:
            self.refuse("stranger", "refused a shard connection before its handshake: %s", why)
            self.shutdown_request(request)
            return
        if not self._unauthenticated.take(source):
            self.refuse(
                "flood",
                "refusing shard connections from %s: %d are already authenticating "
                "(%d at most from one address, %d in all)",
                source,
                self._unauthenticated.held(source),
                MAX_UNAUTHENTICATED,
                MAX_UNAUTHENTICATED_TOTAL,
                line=f"flood/{source}",  # a member's address: a few at most
            )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def authenticated(self, source: str) -> None:
        """A connection left the handshake (authenticated or not): free its place."""
        self._unauthenticated.free(source)

    def refuse(self, kind: str, message: str, *args: object, line: str | None = None) -> None:
        """Count a refusal of `kind` and log it, once a minute per `line` (its kind,
        unless a request's reason gives it a line of its own)."""
        self.refusals[kind] += 1
        self._log.warn(line or kind, message, *args)


class ShardServer:
    """Serves this node's shards and keeps peers' replicas, on the job's address only."""

    def __init__(
        self, host: str, secret: bytes, store: ShardStore, admission: Admission | None = None
    ) -> None:
        """admission None serves every authenticated request (tools and tests only)."""
        self._server = _Server((host, 0), secret, store, admission)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rtrain-shards", daemon=True
        )
        self._thread.start()

    @property
    def refusals(self) -> Counter[str]:
        """Requests and connections refused so far, by kind (stranger, flood, secret,
        put, get, ...; unconfirmed: replicas dropped as their sender went on without
        them)."""
        return self._server.refusals

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
