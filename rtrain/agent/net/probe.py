"""The state network at start-up: which interface this node's replicas and restores use
(the shard server's address), and a small measured transfer to a peer on it.

Cost, bounded: each agent listens on one more port of its job address for
LISTEN_S, and once, after its first generation's membership is known, sends --net-probe
bytes (4 MiB by default, 64 MiB at most) to its ring successor's listener on its own
thread, within SEND_CAP_S; nothing waits for it (the workers start beside it). The
listener reads at most that many bytes a connection, MAX_CONNECTIONS connections in
all, and discards them: what arrives is counted, never parsed. Judged by
core/health/network.py; said as one line and a `net_probe` event.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import psutil

from ...core.health.network import (
    Interface,
    NetChoice,
    choose,
    interfaces_from,
    link_speed,
    warnings,
)
from ...core.rendezvous.protocol import MemberInfo
from ..observe.events import emit
from ..store.kv import KeyValueStore

logger = logging.getLogger(__name__)

LISTEN_S = 120.0  # the listener's life: the first generations' start, not the job's
MAX_CONNECTIONS = 8
SEND_CAP_S = 5.0  # a probe slower than this is stopped; its rate so far is the answer
WAIT_PEER_S = 10.0
CHUNK = 256 * 1024
ACK = struct.Struct("!Q")


def read_interfaces() -> list[Interface]:
    """This host's interfaces: addresses, the speed /sys reports, up or not."""
    addrs = {
        name: [
            a.address.split("%")[0] for a in found if a.family in (socket.AF_INET, socket.AF_INET6)
        ]
        for name, found in psutil.net_if_addrs().items()
    }
    stats = psutil.net_if_stats()
    speeds = {name: _sys_speed(name) for name in addrs}
    up = {name: stats[name].isup for name in addrs if name in stats}
    return interfaces_from(addrs, speeds, up)


def _sys_speed(name: str) -> float | None:
    try:
        with open(f"/sys/class/net/{name}/speed") as handle:
            return link_speed(handle.read(64))
    except OSError:  # absent, or EINVAL where the driver has no speed (loopback)
        return None


def state_choice(host: str) -> NetChoice:
    """The interface the shard server at `host` (a name or an IP) uses."""
    try:
        address = socket.getaddrinfo(host, None)[0][4][0]
    except (OSError, IndexError):
        address = host
    return choose(str(address), read_interfaces())


class NetProbe:
    def __init__(
        self, host: str, size: int, store: KeyValueStore, key_of: Callable[[str], str]
    ) -> None:
        """host: this node's job address; size: bytes to send (0: no probe); key_of: the
        job's StoreKeys.net_probe (the store key of a node's listener port)."""
        self._host, self._size, self._store = host, size, store
        self._key_of = key_of
        self._sent = False
        self._listener: socket.socket | None = None
        if size > 0:
            self._listen()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET)
        try:
            listener.bind((self._host, 0))
            listener.listen(MAX_CONNECTIONS)
        except OSError as exc:
            listener.close()
            logger.warning("state network probe: no listener on %s: %s", self._host, exc)
            return
        self._listener = listener
        self._store.set(self._key_of(self._host), str(listener.getsockname()[1]))
        threading.Thread(target=self._serve, name="rtrain-net-probe", daemon=True).start()

    def _serve(self) -> None:
        listener = self._listener
        assert listener is not None
        end = time.monotonic() + LISTEN_S
        try:
            for _ in range(MAX_CONNECTIONS):
                listener.settimeout(max(end - time.monotonic(), 0.01))
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(SEND_CAP_S)
                    count = _drain(conn, self._size)
                    conn.sendall(ACK.pack(count))
        except OSError:
            pass  # the listener's time is up, or it was closed: no more probes
        finally:
            listener.close()

    def after_admit(self, members: Sequence[MemberInfo], node_rank: int) -> None:
        """Once, at the first generation: the probe to the ring successor, on its own
        thread."""
        if self._sent or self._size <= 0 or self._listener is None:
            return
        self._sent = True
        peer = members[(node_rank + 1) % len(members)].addr if len(members) > 1 else None
        threading.Thread(
            target=self._probe, args=(peer,), name="rtrain-net-probe-send", daemon=True
        ).start()

    def _probe(self, peer: str | None) -> None:
        choice = state_choice(self._host)
        rate = None
        if peer is not None and peer != self._host:
            try:
                rate = self._send(peer)
            except (OSError, ValueError) as exc:
                logger.warning("state network probe to %s failed: %s", peer, exc)
        said = warnings(choice, rate)
        shown = "not measured" if rate is None else f"{rate:.0f} Mb/s to {peer}"
        logger.info("state network: %s; probe %s", choice.describe(), shown)
        for line in said:
            logger.warning("state network: %s", line)
        emit(
            "net_probe",
            interface=choice.interface or "",
            address=choice.address,
            peer=peer or "",
            rate_mbps=rate if rate is not None else 0.0,
            link_mbps=choice.speed_mbps,
            bytes=self._size,
            warnings=said,
        )

    def _send(self, peer: str) -> float:
        """Mbit/s of size bytes to peer's listener, until its count came back."""
        key = self._key_of(peer)
        if not self._store.wait([key], WAIT_PEER_S):
            raise ValueError(f"no probe listener published within {WAIT_PEER_S:g}s")
        port = int((self._store.get(key) or b"").decode() or "0")
        if not 0 < port < 65536:
            raise ValueError(f"a probe port that is no port: {port}")
        payload = b"\0" * CHUNK
        with socket.create_connection((peer, port), timeout=SEND_CAP_S) as conn:
            start = time.perf_counter()
            left = self._size
            while left > 0 and time.perf_counter() - start < SEND_CAP_S:
                conn.sendall(payload[: min(left, CHUNK)])
                left -= min(left, CHUNK)
            conn.shutdown(socket.SHUT_WR)
            got = ACK.unpack(_exactly(conn, ACK.size))[0]
            seconds = time.perf_counter() - start
        return got * 8 / 1e6 / max(seconds, 1e-6)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()


def _drain(conn: socket.socket, limit: int) -> int:
    """Bytes read and dropped, up to limit, until the sender is done."""
    count = 0
    while count < limit:
        data = conn.recv(min(CHUNK, limit - count))
        if not data:
            break
        count += len(data)
    return count


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ValueError("the peer closed before its count")
        data += more
    return data
