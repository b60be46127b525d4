"""ShardServer and ShardClient: agents hand each other shards over TCP, authenticated.

Every connection starts with a mutual challenge: the server sends a random nonce, the
client answers HMAC-SHA256(job secret, nonce) and its own nonce, the server answers
that. A peer without the secret gets nothing and learns nothing; a client never sends
a shard to, or trusts one from, a server that cannot prove it has the secret. Then
requests go as a 4-byte length + JSON header, then raw bytes:

  put {gen, rank, step, size, crcs} + shard   -> {ok}    keep a replica
  get {gen, rank, step}                       -> {ok, size, crcs} + shard

Shards carry their chunk checksums; the receiver verifies them before keeping or using a
shard, so a corrupt copy is refused, never restored. An authenticated request is then
judged by core.snapshots.admission (who may put what, who may get).

Before authentication a connection costs a thread and a descriptor, so at most
MAX_UNAUTHENTICATED are open at once and each must finish the handshake within
HANDSHAKE_S in all (not per read): a slow or flooding client is cut off, and a flood
is logged once a minute, not once per connection.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...core.errors import RtrainError
from ...core.snapshots.admission import Admission
from ...core.snapshots.format import CHUNK, HEADER_SIZE, chunk_digest
from ...core.snapshots.restore_plan import ShardId
from .shard_store import ShardStore

logger = logging.getLogger(__name__)

MAGIC = b"RTRS"
NONCE = 32
MAX_HEADER = 1 << 20
IO_TIMEOUT_S = 30.0
BUFFER = 1 << 20
MAX_UNAUTHENTICATED = 32
HANDSHAKE_S = 5.0
LOG_EVERY_S = 60.0


class ShardError(RtrainError):
    """A peer that would not authenticate, answered garbage, or sent a corrupt shard."""


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """`size` bytes; with a deadline (time.monotonic), all of them by then."""
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ShardError(f"no handshake within {HANDSHAKE_S:g}s")
            sock.settimeout(left)
        chunk = sock.recv(min(size - len(data), BUFFER))
        if not chunk:
            raise ShardError("connection closed by peer")
        data += chunk
    return bytes(data)


def _recv_into(sock: socket.socket, buffer: Any, size: int) -> None:
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:size], min(size - got, BUFFER))
        if n == 0:
            raise ShardError("connection closed by peer")
        got += n


def _recv_verified(sock: socket.socket, buffer: Any, size: int) -> list[int]:
    """Receive a shard and checksum it as it arrives: each chunk's digest runs on a helper
    thread while the next chunk is received (both release the GIL)."""
    _recv_into(sock, buffer, min(HEADER_SIZE, size))
    view = memoryview(buffer)
    futures = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        for start in range(HEADER_SIZE, max(size, HEADER_SIZE + 1), CHUNK):
            end = min(start + CHUNK, size)
            _recv_into_range(sock, view, start, end)
            futures.append(pool.submit(chunk_digest, view[start:end]))
    return [f.result() for f in futures]


def _recv_into_range(sock: socket.socket, view: memoryview, start: int, end: int) -> None:
    got = start
    while got < end:
        n = sock.recv_into(view[got:end], min(end - got, BUFFER))
        if n == 0:
            raise ShardError("connection closed by peer")
        got += n


def _send_message(sock: socket.socket, header: dict[str, Any], payload: Any = None) -> None:
    body = json.dumps(header).encode()
    sock.sendall(struct.pack("<I", len(body)) + body)
    if payload is not None:
        sock.sendall(payload)


def _recv_message(sock: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack("<I", _recv_exact(sock, 4))
    if length > MAX_HEADER:
        raise ShardError("peer sent an oversized header")
    try:
        header = json.loads(_recv_exact(sock, length))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ShardError("peer sent a header that is not JSON") from None
    if not isinstance(header, dict):
        raise ShardError("peer sent a header that is not an object")
    return header


class _RateLimitedLog:
    """One warning per kind of event per LOG_EVERY_S, with the count since the last."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last, skipped = self._last.get(kind, (-LOG_EVERY_S, 0))
            if now - last < LOG_EVERY_S:
                self._last[kind] = (last, skipped + 1)
                return
            self._last[kind] = (now, 0)
        more = f" ({skipped} more like it since the last report)" if skipped else ""
        logger.warning(message + more, *args)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        peer = self.client_address[0]
        try:
            if not self._authenticate(sock, peer):
                return
            sock.settimeout(IO_TIMEOUT_S)
            while True:
                try:
                    request = _recv_message(sock)
                except ShardError:
                    return
                if not self._serve(sock, request, peer):
                    return
        except (OSError, RtrainError) as exc:  # ShardError, a full /dev/shm: the peer retries
            self.server.refuse("failed", "shard connection from %s failed: %s", peer, exc)

    def _authenticate(self, sock: socket.socket, peer: str) -> bool:
        secret = self.server.secret
        try:
            deadline = time.monotonic() + HANDSHAKE_S
            sock.settimeout(HANDSHAKE_S)
            nonce = secrets.token_bytes(NONCE)
            sock.sendall(MAGIC + nonce)
            answer = _recv_exact(sock, 32 + NONCE, deadline)
            if not hmac.compare_digest(answer[:32], _mac(secret, b"client", nonce)):
                self.server.refuse(
                    "secret", "refused a shard client without the job secret (%s)", peer
                )
                return False
            sock.sendall(_mac(secret, b"server", answer[32:]))
            return True
        except (OSError, ShardError) as exc:
            self.server.refuse("handshake", "shard client %s did not authenticate: %s", peer, exc)
            return False
        finally:
            self.server.authenticated()

    def _serve(self, sock: socket.socket, request: dict[str, Any], peer: str) -> bool:
        """Answer one request; False: close the connection (a refused put's payload
        follows its header, so the stream cannot go on)."""
        store, admission = self.server.store, self.server.admission
        try:
            shard = ShardId(int(request["gen"]), int(request["rank"]), int(request["step"]))
        except (KeyError, TypeError, ValueError):
            _send_message(sock, {"ok": False, "error": "malformed request"})
            return request.get("op") != "put"
        if request.get("op") == "put":
            try:
                size, crcs = int(request["size"]), [int(c) for c in request["crcs"]]
            except (KeyError, TypeError, ValueError):
                size = -1
            if size < HEADER_SIZE:
                _send_message(sock, {"ok": False, "error": "malformed request"})
                return False
            kept = store.replica_steps(shard.generation, shard.rank)
            why = (
                None
                if admission is None
                else admission.refuse_put(peer, shard.generation, shard.step, kept)
            )
            if why is not None:
                self.server.refuse("put", "refused a replica of %s from %s: %s", shard, peer, why)
                _send_message(sock, {"ok": False, "error": f"refused: {why}"})
                return False
            with store.receive(shard, size) as buffer:
                ok = _recv_verified(sock, buffer, size) == crcs
                if ok:
                    store.keep_replica(shard, size, crcs)
            if not ok:  # the sender checks its slot did not change: this is corruption
                self.server.refuse(
                    "mismatch", "a replica of %s from %s failed its checksum", shard, peer
                )
            _send_message(sock, {"ok": ok, "error": "" if ok else "checksum mismatch"})
            return True
        if request.get("op") == "get":
            why = None if admission is None else admission.refuse_get(peer)
            if why is not None:
                self.server.refuse("get", "refused %s to %s: %s", shard, peer, why)
                _send_message(sock, {"ok": False, "error": f"refused: {why}"})
                return True
            found = store.open_shard(shard)
            if found is None:
                _send_message(sock, {"ok": False, "error": "not held"})
                return True
            buffer, size, crcs = found
            _send_message(sock, {"ok": True, "size": size, "crcs": crcs}, memoryview(buffer)[:size])
            return True
        _send_message(sock, {"ok": False, "error": "unknown op"})
        return True


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
        self._log = _RateLimitedLog()
        self._unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)
        super().__init__(addr, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # The bound is taken before a thread exists: a flood costs no threads.
        if not self._unauthenticated.acquire(blocking=False):
            self.refuse(
                "flood",
                "refusing shard connections: %d are already authenticating (latest from %s)",
                MAX_UNAUTHENTICATED,
                client_address[0],
            )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def authenticated(self) -> None:
        """A connection left the handshake (authenticated or not): free its place."""
        self._unauthenticated.release()

    def refuse(self, kind: str, message: str, *args: object) -> None:
        self.refusals[kind] += 1
        self._log.warn(kind, message, *args)


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
        """Requests and connections refused so far, by kind (flood, secret, put, ...)."""
        return self._server.refusals

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ShardClient:
    def __init__(self, host: str, port: int, secret: bytes, source: str | None = None) -> None:
        """source: this node's job address, which the server judges requests by."""
        self._sock = _connect(host, port, source)
        try:
            hello = _recv_exact(self._sock, len(MAGIC) + NONCE)
            if hello[: len(MAGIC)] != MAGIC:
                raise ShardError(f"{host}:{port} is not an rtrain shard server")
            mine = secrets.token_bytes(NONCE)
            self._sock.sendall(_mac(secret, b"client", hello[len(MAGIC) :]) + mine)
            try:
                proof = _recv_exact(self._sock, 32)
            except ShardError:
                raise ShardError(
                    f"{host}:{port} closed the connection: it does not accept this job's secret"
                ) from None
            if not hmac.compare_digest(proof, _mac(secret, b"server", mine)):
                raise ShardError(f"{host}:{port} could not prove it has the job secret")
        except (OSError, ShardError):
            self._sock.close()
            raise

    def put(self, shard: ShardId, buffer: Any, size: int, crcs: list[int]) -> None:
        header = {"op": "put", "gen": shard.generation, "rank": shard.rank, "step": shard.step}
        try:
            _send_message(
                self._sock, {**header, "size": size, "crcs": crcs}, memoryview(buffer)[:size]
            )
        except OSError:
            # A refusal comes before the payload is read, then the peer closes: its
            # answer says why, where the broken pipe would not.
            try:
                reply = _recv_message(self._sock)
            except (OSError, ShardError):
                raise ShardError("the peer closed the connection during a put") from None
        else:
            reply = _recv_message(self._sock)
        if not reply.get("ok"):
            raise ShardError(f"peer refused the replica: {reply.get('error', '?')}")

    def get(self, shard: ShardId, into: Any) -> tuple[int, list[int]]:
        """Fetch a shard into the buffer returned by into(size); verify it; (size, crcs)."""
        request = {"op": "get", "gen": shard.generation, "rank": shard.rank, "step": shard.step}
        _send_message(self._sock, request)
        reply = _recv_message(self._sock)
        if not reply.get("ok"):
            raise ShardError(f"peer does not hold {shard}: {reply.get('error', '?')}")
        try:
            size, crcs = int(reply["size"]), [int(c) for c in reply["crcs"]]
        except (KeyError, TypeError, ValueError):
            raise ShardError("peer answered a get with garbage") from None
        buffer = into(size)
        if _recv_verified(self._sock, buffer, size) != crcs:
            raise ShardError(f"the copy of {shard} failed its checksum")
        return size, crcs

    def close(self) -> None:
        self._sock.close()


def _connect(host: str, port: int, source: str | None) -> socket.socket:
    if source:
        try:
            return socket.create_connection((host, port), IO_TIMEOUT_S, (source, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            # Not an address of this machine (NAT, a name for another interface): the
            # peer may refuse requests from the address the kernel picks instead.
    return socket.create_connection((host, port), timeout=IO_TIMEOUT_S)
