"""ShardClient: one authenticated connection to a peer's shard server (wire.py)."""

from __future__ import annotations

import errno
import hmac
import secrets
import socket
from typing import Any

from ....core.snapshots.format import HEADER_SIZE, chunk_bounds
from ....core.snapshots.restore_plan import ShardId
from .wire import (
    IO_TIMEOUT_S,
    MAGIC,
    NONCE,
    ShardError,
    mac,
    recv_exact,
    recv_message,
    recv_verified,
    send_message,
)


class ShardClient:
    def __init__(self, host: str, port: int, secret: bytes, source: str | None = None) -> None:
        """source: this node's job address, which the server judges requests by."""
        self._sock = connect(host, port, source)
        try:
            try:
                hello = recv_exact(self._sock, len(MAGIC) + NONCE)
            except (ConnectionError, ShardError):
                raise ShardError(
                    f"{host}:{port} refused the connection before its handshake (this "
                    "address is not a member of its generation, or has too many "
                    "connections open)"
                ) from None
            if hello[: len(MAGIC)] != MAGIC:
                raise ShardError(f"{host}:{port} is not an rtrain shard server")
            mine = secrets.token_bytes(NONCE)
            self._sock.sendall(mac(secret, b"client", hello[len(MAGIC) :]) + mine)
            try:
                proof = recv_exact(self._sock, 32)
            except ShardError:
                raise ShardError(
                    f"{host}:{port} closed the connection: it does not accept this job's secret"
                ) from None
            if not hmac.compare_digest(proof, mac(secret, b"server", mine)):
                raise ShardError(f"{host}:{port} could not prove it has the job secret")
        except (OSError, ShardError):
            self._sock.close()
            raise

    def put(
        self,
        shard: ShardId,
        buffer: Any,
        size: int,
        crcs: list[int],
        base: ShardId | None = None,
    ) -> int:
        """Keep a replica on the peer; with `base` (a shard the peer holds, a DP twin's)
        send only the chunks it lacks. The bytes of shard data sent."""
        header = {"op": "put", "gen": shard.generation, "rank": shard.rank, "step": shard.step}
        if base is not None:
            header["base"] = [base.generation, base.rank, base.step]
            return self._put_against_base(header, buffer, size, crcs)
        try:
            send_message(
                self._sock, {**header, "size": size, "crcs": crcs}, memoryview(buffer)[:size]
            )
        except OSError:
            # A refusal comes before the payload is read, then the peer closes: its
            # answer says why, where the broken pipe would not.
            try:
                reply = recv_message(self._sock)
            except (OSError, ShardError):
                raise ShardError("the peer closed the connection during a put") from None
        else:
            reply = recv_message(self._sock)
        if not reply.get("ok"):
            raise ShardError(f"peer refused the replica: {reply.get('error', '?')}")
        return size

    def _put_against_base(
        self, header: dict[str, Any], buffer: Any, size: int, crcs: list[int]
    ) -> int:
        view = memoryview(buffer)
        send_message(self._sock, {**header, "size": size, "crcs": crcs}, view[:HEADER_SIZE])
        reply = recv_message(self._sock)
        need = reply.get("need")
        if not isinstance(need, list):
            raise ShardError(f"peer refused the replica: {reply.get('error', '?')}")
        bounds = chunk_bounds(view[:HEADER_SIZE], size)
        sent = HEADER_SIZE
        for index in sorted(set(need)):
            if not (isinstance(index, int) and 0 <= index < len(bounds)):
                raise ShardError("peer asked for a chunk the shard does not have")
            start, end = bounds[index]
            self._sock.sendall(view[start:end])
            sent += end - start
        reply = recv_message(self._sock)
        if not reply.get("ok"):
            raise ShardError(f"peer refused the replica: {reply.get('error', '?')}")
        return sent

    def get(self, shard: ShardId, into: Any) -> tuple[int, list[int]]:
        """Fetch a shard into the buffer returned by into(size); verify it; (size, crcs)."""
        request = {"op": "get", "gen": shard.generation, "rank": shard.rank, "step": shard.step}
        send_message(self._sock, request)
        reply = recv_message(self._sock)
        if not reply.get("ok"):
            raise ShardError(f"peer does not hold {shard}: {reply.get('error', '?')}")
        try:
            size, crcs = int(reply["size"]), [int(c) for c in reply["crcs"]]
        except (KeyError, TypeError, ValueError):
            raise ShardError("peer answered a get with garbage") from None
        buffer = into(size)
        if recv_verified(self._sock, buffer, size) != crcs:
            raise ShardError(f"the copy of {shard} failed its checksum")
        return size, crcs

    def close(self) -> None:
        self._sock.close()


def connect(host: str, port: int, source: str | None) -> socket.socket:
    sock = _connect(host, port, source)
    # A request is a few small writes, then a read: without this, Nagle's algorithm and
    # the server's delayed ACK held each put 44 ms (0.3 ms with it, loopback).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


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
