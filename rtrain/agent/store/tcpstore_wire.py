"""TCPStore's wire protocol without torch: the connection, and `rtrain status`'s reader.

`import torch` takes 1.5-2 s, most of a status command's time over TCPStore (etcd's
answers in 0.4 s), so the reader speaks TCPStore's wire protocol itself for the four
reads it makes; the agents reach the job's store the same way (tcpstore_client.py, on
TCPStoreConnection below), so that only the store's host imports torch to start.
That protocol is torch's private interface (c10d's TCPStore.cpp and its two server
backends), so everything that knows it is in this module and tcpstore_client.py:

- it is used only when the installed torch is a version it was written against
  (TESTED_TORCH; read from the package metadata, not by importing torch), and the
  server answers the handshake (a validation word, then a ping whose nonce must come
  back); otherwise `rtrain status` and the agents use torch's own client;
- tests/unit/agent/test_tcpstore_wire.py and test_tcpstore_client.py run them against
  the installed torch's real TCPStore, both server backends, and fail when torch
  changes what it answers.

What is sent: a one-byte query type, then its arguments; a string or a value is a
little-endian uint64 length and the bytes, as TCPStore's client writes them. Keys get
TCPStore's "/" prefix. The reader never writes, and it never wakes an agent: a key is checked
before it is read, and read (a multi-get) only once it is set, since the server would
wait on a missing one. It sends no compare-and-set, not even the agents' read with a
sentinel that writes nothing: torch's server wakes every client waiting on a key when
any client compare-sets it, set or not, and agents wait on the keys status reads (a
round's closed membership; issue 32: one status request in an open round had every
waiting agent take the round for closed). Every answer's length is bounded before
anything is allocated for it, and every call is bounded by the socket's deadline.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TypeVar

from ...core.errors import RendezvousError, StoreUnavailable
from .kv import as_bytes, decode_counter

# torch minor versions whose TCPStore this client was written against (2.4: the libuv
# server became the default; the protocol below is the same for both servers). Only
# 2.13 is tested on this project's machines.
TESTED_TORCH = ((2, 4), (2, 13))
MAGIC = 0x3C85F7CE
# c10d's QueryType values (TCPStoreBackend.hpp) this client sends.
VALIDATE, CHECK, MULTI_GET, PING = 0, 5, 10, 13
READY = 0  # CheckResponseType
KEY_PREFIX = b"/"
MAX_VALUE = 64 << 20  # the largest answer accepted (a 2,048-node membership is 18 KB)
MAX_KEYS = 1 << 16
T = TypeVar("T")
C = TypeVar("C", bound="TCPStoreConnection")


class WireUnsupported(Exception):
    """This client should not talk to this store: use torch's."""


def torch_version_supported(version: Callable[[str], str] = metadata.version) -> bool:
    """Whether the installed torch is one whose TCPStore protocol this client speaks."""
    try:
        found = re.match(r"(\d+)\.(\d+)", version("torch"))
    except metadata.PackageNotFoundError:
        return False
    if found is None:
        return False
    minor = (int(found.group(1)), int(found.group(2)))
    return TESTED_TORCH[0] <= minor <= TESTED_TORCH[1]


class StoreUnreachable(StoreUnavailable):
    """No connection to the store's address within the deadline; reason: why, in a few
    words (connection refused: nothing listens on that port)."""

    def __init__(self, endpoint: str, deadline_s: float, reason: str) -> None:
        super().__init__(
            f"cannot reach the rendezvous store at {endpoint} within {deadline_s:g}s: {reason}"
        )
        self.reason = reason


def unreachable_reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    return str(exc.strerror or exc)


class TCPStoreConnection:
    """One client connection to a TCPStore, past its handshake; the queries' wire.

    connect() raises StoreUnavailable when nothing answers within deadline_s, and
    WireUnsupported when something answers but not as TCPStore does."""

    def __init__(self, sock: socket.socket, endpoint: str) -> None:
        self._sock = sock
        self.endpoint = endpoint
        self._broken: str | None = None

    @classmethod
    def connect(
        cls: type[C],
        host: str,
        port: int,
        deadline_s: float,
        on_refused: Callable[[], None] | None = None,
        retry_refused: bool = True,
    ) -> C:
        """on_refused: called at each refused connection (the store's host may still be
        starting: retried until deadline_s unless retry_refused is False)."""
        endpoint = f"{host}:{port}"
        # The OS's clock, not the job's: the socket's own timeout is set from it.
        deadline = time.monotonic() + deadline_s
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((host, port), timeout=max(left, 0.05))
                break
            except OSError as exc:
                # refused: the store may be starting (torch's client retries too)
                refused = isinstance(exc, ConnectionRefusedError)
                if refused and on_refused is not None:
                    on_refused()
                if left <= 0.1 or not refused or not retry_refused:
                    raise StoreUnreachable(endpoint, deadline_s, unreachable_reason(exc)) from None
                time.sleep(0.1)
        sock.settimeout(deadline_s)
        # Queries are small and some get no answer (a set): no wait for the last ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = cls(sock, endpoint)
        nonce = int(time.monotonic_ns() & 0xFFFFFFFF)  # a ping's nonce, not a time
        try:
            sock.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
            echoed = struct.unpack("<I", reader._read(4))[0]
        except TimeoutError:  # connected, but nothing answers: stopped or frozen
            sock.close()
            raise StoreUnavailable(
                f"the rendezvous store at {endpoint} did not answer within {deadline_s:g}s "
                "(its host is stopped, frozen or cut off)"
            ) from None
        except (OSError, RendezvousError):  # it answers, but not as TCPStore does
            sock.close()
            raise WireUnsupported(f"{endpoint} did not answer TCPStore's handshake") from None
        if echoed != nonce:
            sock.close()
            raise WireUnsupported(f"{endpoint} answered TCPStore's ping with another nonce")
        return reader

    def close(self) -> None:
        self._sock.close()

    # -- the wire -----------------------------------------------------------------------

    def _multi_get(self, keys: list[str]) -> list[bytes]:
        """Keys checked set (the server waits on a missing one)."""
        query = bytes([MULTI_GET]) + struct.pack("<Q", len(keys))
        query += b"".join(_string(_key(k)) for k in keys)
        return self._ask(query, lambda: [self._value() for _ in keys])

    def _check(self, keys: list[str]) -> bool:
        query = bytes([CHECK]) + struct.pack("<Q", len(keys))
        query += b"".join(_string(_key(k)) for k in keys)
        answer = self._ask(query, lambda: self._read(1))[0]
        if answer not in (0, 1):
            raise self._fail(f"answered a check with {answer}")
        return answer == READY

    def _ask(self, query: bytes, answer: Callable[[], T]) -> T:
        if self._broken is not None:
            raise self._lost(self._broken)
        try:
            self._sock.sendall(query)
            return answer()
        except TimeoutError:
            raise self._fail(
                "did not answer within the deadline (stopped, frozen or cut off)"
            ) from None
        except OSError as exc:
            raise self._fail(f"dropped the connection ({exc.strerror or exc})") from None

    def _value(self) -> bytes:
        size = struct.unpack("<Q", self._read(8))[0]
        if size > MAX_VALUE:
            raise self._fail(f"announced a {size}-byte value (at most {MAX_VALUE})")
        return self._read(size)

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                raise self._fail("closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _fail(self, what: str) -> Exception:
        # A connection left mid-answer cannot be trusted for the next query.
        self._broken = what
        self._sock.close()
        return self._lost(what)

    def _lost(self, what: str) -> Exception:
        """The error of a call on a connection that failed (what: how)."""
        return StoreUnavailable(f"the rendezvous store at {self.endpoint} {what}")


class TCPStoreReader(TCPStoreConnection):
    """get, exists, counter and multi_get (the KeyValueStore reads) over one connection."""

    def get(self, key: str) -> bytes | None:
        if not self._check([key]):
            return None
        return self._multi_get([key])[0]

    def exists(self, key: str) -> bool:
        return self._check([key])

    def counter(self, key: str) -> int:
        return decode_counter(self.get(key), key)

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        listed = list(keys)
        if not listed:
            return []
        if len(listed) > MAX_KEYS:
            raise RendezvousError(f"multi_get of {len(listed)} keys (at most {MAX_KEYS})")
        if not self._check(listed):
            return [self.get(key) for key in listed]
        return list(self._multi_get(listed))


def _key(key: str) -> bytes:
    return KEY_PREFIX + key.encode()


def _string(data: bytes | str) -> bytes:
    raw = as_bytes(data)
    return struct.pack("<Q", len(raw)) + raw
