"""ShardServer and ShardClient: agents hand each other shards over TCP, authenticated.

Every connection starts with a mutual challenge: the server sends a random nonce, the
client answers HMAC-SHA256(job secret, nonce) and its own nonce, the server answers
that. A peer without the secret gets nothing and learns nothing; a client never sends
a shard to, or trusts one from, a server that cannot prove it has the secret. Then
requests go as a 4-byte length + JSON header, then raw bytes:

  put {gen, rank, step, size, crcs} + shard   -> {ok}    keep a replica
  get {gen, rank, step}                       -> {ok, size, crcs} + shard

Shards carry their chunk checksums; the receiver verifies them before keeping or using a
shard, so a corrupt copy is refused, never restored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rtrain.agent.shard_store import ShardStore
from rtrain.core.errors import RtrainError
from rtrain.core.restore_plan import ShardId
from rtrain.core.snapshot_format import CHUNK, HEADER_SIZE, chunk_digest

logger = logging.getLogger(__name__)

MAGIC = b"RTRS"
NONCE = 32
MAX_HEADER = 1 << 20
IO_TIMEOUT_S = 30.0
BUFFER = 1 << 20


class ShardError(RtrainError):
    """A peer that would not authenticate, answered garbage, or sent a corrupt shard."""


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
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


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(IO_TIMEOUT_S)
        secret = self.server.secret
        try:
            nonce = secrets.token_bytes(NONCE)
            sock.sendall(MAGIC + nonce)
            answer = _recv_exact(sock, 32 + NONCE)
            if not hmac.compare_digest(answer[:32], _mac(secret, b"client", nonce)):
                logger.warning("refused a shard client without the job secret")
                return
            sock.sendall(_mac(secret, b"server", answer[32:]))
            while True:
                try:
                    request = _recv_message(sock)
                except ShardError:
                    return
                self._serve(sock, request)
        except (OSError, ShardError) as exc:
            logger.warning("shard connection from %s failed: %s", self.client_address[0], exc)

    def _serve(self, sock: socket.socket, request: dict[str, Any]) -> None:
        store = self.server.store
        try:
            shard = ShardId(int(request["gen"]), int(request["rank"]), int(request["step"]))
        except (KeyError, TypeError, ValueError):
            _send_message(sock, {"ok": False, "error": "malformed request"})
            return
        if request.get("op") == "put":
            size, crcs = int(request["size"]), [int(c) for c in request["crcs"]]
            with store.receive(shard, size) as buffer:
                ok = _recv_verified(sock, buffer, size) == crcs
                if ok:
                    store.keep_replica(shard, size, crcs)
            _send_message(sock, {"ok": ok, "error": "" if ok else "checksum mismatch"})
        elif request.get("op") == "get":
            found = store.open_shard(shard)
            if found is None:
                _send_message(sock, {"ok": False, "error": "not held"})
                return
            buffer, size, crcs = found
            _send_message(sock, {"ok": True, "size": size, "crcs": crcs}, memoryview(buffer)[:size])
        else:
            _send_message(sock, {"ok": False, "error": "unknown op"})


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], secret: bytes, store: ShardStore) -> None:
        self.secret = secret
        self.store = store
        super().__init__(addr, _Handler)


class ShardServer:
    """Serves this node's shards and keeps peers' replicas, on the job's address only."""

    def __init__(self, host: str, secret: bytes, store: ShardStore) -> None:
        self._server = _Server((host, 0), secret, store)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rtrain-shards", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ShardClient:
    def __init__(self, host: str, port: int, secret: bytes) -> None:
        self._sock = socket.create_connection((host, port), timeout=IO_TIMEOUT_S)
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
        _send_message(self._sock, {**header, "size": size, "crcs": crcs}, memoryview(buffer)[:size])
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
