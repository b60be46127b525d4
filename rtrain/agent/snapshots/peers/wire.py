"""The wire between shard servers and clients: the handshake's MACs and the framing.

Every connection starts with a mutual challenge: the server sends a random nonce, the
client answers HMAC-SHA256(job secret, nonce) and its own nonce, the server answers
that. A peer without the secret gets nothing and learns nothing; a client never sends
a shard to, or trusts one from, a server that cannot prove it has the secret. Then
requests go as a 4-byte length + JSON header, then raw bytes:

  put {gen, rank, step, size, crcs} + shard   -> {ok}    keep a replica
  put {..., base} + header -> {need} + chunks -> {ok}    the same, against a shard held
                                                         there (agent/snapshots/peers/delta.py)
  get {gen, rank, step}                       -> {ok, size, crcs} + shard

Shards carry their chunk checksums; the receiver verifies them before keeping or using a
shard, so a corrupt copy is refused, never restored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import time
from typing import Any

from ....core.errors import RtrainError
from ....core.snapshots.format import HEADER_SIZE, chunk_bounds, chunk_hasher

MAGIC = b"RTRS"
NONCE = 32
MAX_HEADER = 1 << 20
IO_TIMEOUT_S = 30.0
BUFFER = 1 << 20
HANDSHAKE_S = 5.0


class ShardError(RtrainError):
    """A peer that would not authenticate, answered garbage, or sent a corrupt shard."""


def mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """`size` bytes; with a deadline (time.monotonic), all of them by then. (The OS's
    clock, not the job's: it sets the socket's own timeout.)"""
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


def recv_into(sock: socket.socket, buffer: Any, size: int) -> None:
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:size], min(size - got, BUFFER))
        if n == 0:
            raise ShardError("connection closed by peer")
        got += n


def recv_verified(sock: socket.socket, buffer: Any, size: int) -> list[int]:
    """Receive a shard and checksum it as it arrives: each piece a recv returns is fed
    to its chunk's streaming digest at once, while it is still in the cache (the same
    digest as chunk_digest over the whole chunk). Before, each whole 8 MiB chunk was
    hashed on a helper thread: read again from memory, and on a loaded 2-core node
    the thread waited for a core, so a restore from a peer ran at 0.46-0.70 of a
    loopback stream."""
    recv_into(sock, buffer, min(HEADER_SIZE, size))
    view = memoryview(buffer)
    digests = []
    for start, end in chunk_bounds(view[:HEADER_SIZE], size):
        digest = chunk_hasher()
        got = start
        while got < end:
            n = sock.recv_into(view[got:end], min(end - got, BUFFER))
            if n == 0:
                raise ShardError("connection closed by peer")
            digest.update(view[got : got + n])
            got += n
        digests.append(digest.intdigest())
    return digests


def recv_into_range(sock: socket.socket, view: memoryview, start: int, end: int) -> None:
    got = start
    while got < end:
        n = sock.recv_into(view[got:end], min(end - got, BUFFER))
        if n == 0:
            raise ShardError("connection closed by peer")
        got += n


def send_message(sock: socket.socket, header: dict[str, Any], payload: Any = None) -> None:
    body = json.dumps(header).encode()
    sock.sendall(struct.pack("<I", len(body)) + body)
    if payload is not None:
        sock.sendall(payload)


def recv_message(sock: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack("<I", recv_exact(sock, 4))
    if length > MAX_HEADER:
        raise ShardError("peer sent an oversized header")
    try:
        header = json.loads(recv_exact(sock, length))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ShardError("peer sent a header that is not JSON") from None
    if not isinstance(header, dict):
        raise ShardError("peer sent a header that is not an object")
    return header
