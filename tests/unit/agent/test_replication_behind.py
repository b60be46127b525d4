"""A replication that falls behind never stalls the step (issue 35 item 2).

The real parts: the agent's Replicator sends a worker's slots to a real ShardServer,
through a TCP proxy that passes the sender's bytes at 10 MB/s (a throttled peer); the
test's thread is the training loop calling the real snapshot() every step. Before,
each snapshot waited for the last one's replication (0.4 s a shard here); with the
adapt policy (RTRAIN_SNAPSHOT_POLICY=adapt) a step that finds it unfinished is
skipped, the worker keeps every k-th step, and the agent says so in events.jsonl
(`snapshot_interval`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from rtrain.agent.observe.events import EVENTS
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.replication.replicator import Replicator
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.observe.events import read_events
from rtrain.core.snapshots.format import read_shard
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.worker import snapshots as snapshot_api

SECRET = b"0123456789abcdef0123456789abcdef"
RATE = 10 * 2**20  # bytes a second, the sender's way
STATE_MB = 4
STEP_S = 0.02  # the step's compute


class ThrottledProxy:
    """Forwards connections to `port`; the client's bytes at RATE, the replies as they come."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port_to))
            self.sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, RATE), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, 0), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, rate: int) -> None:
        began, moved = time.monotonic(), 0
        with contextlib.suppress(OSError):
            while data := source.recv(64 * 1024):
                sink.sendall(data)
                moved += len(data)
                if rate:  # the link's pace: hold the bytes until their time
                    ahead = moved / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.mark.slow
def test_a_throttled_peer_never_stalls_the_step_and_the_interval_adapts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = ShardStore(str(tmp_path / "a"), budget=0)
    receiver = ShardStore(str(tmp_path / "b"), budget=2**28)
    server = ShardServer("127.0.0.1", SECRET, receiver)
    proxy = ThrottledProxy(server.port)
    EVENTS.open(str(tmp_path), "127.0.0.1")
    replicator = Replicator(sender, TcpTransport(SECRET))
    monkeypatch.setenv(snapshot_api.SNAPSHOT_DIR, sender.snap_dir(0))
    monkeypatch.setenv(snapshot_api.SNAPSHOT_POLICY, "adapt")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(snapshot_api, "_slots", None)
    weights = torch.zeros(STATE_MB * 2**20 // 4)
    inside: list[float] = []
    kept: list[int] = []
    try:
        replicator.follow(0, [("127.0.0.1", proxy.port)], world_size=1, local_ranks=1)
        for step in range(80):
            time.sleep(STEP_S)  # the step's compute
            weights.fill_(float(step))
            began = time.perf_counter()
            if snapshot_api.snapshot({"w": weights, "step": step}, step):
                kept.append(step)
            inside.append(time.perf_counter() - began)
    finally:
        replicator.close()
        proxy.close()
        server.close()
        EVENTS.close()
    copy = min(_copy_seconds(weights) for _ in range(3))
    shard_s = STATE_MB * 2**20 / RATE  # what one replica takes through the proxy
    # The step paid a copy, never a replication: the old policy waited about shard_s.
    assert max(inside) < shard_s / 2, (max(inside), copy, shard_s)
    assert len(kept) < 40  # steps were skipped, not waited for
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    events = [e for e in read_events(lines)[0] if e.name == "snapshot_interval"]
    assert events and max(e["interval"] for e in events) >= 8, events
    assert all(e["rank"] == 0 and e["interval"] != e["previous"] for e in events)
    # What did reach the peer is the state of its step, bitwise.
    steps = receiver.replica_steps(0, 0)
    assert steps and set(steps) <= set(kept)
    held = receiver.open_shard(ShardId(0, 0, max(steps)))
    assert held is not None
    state, step = read_shard(held[0])
    assert step == max(steps) and torch.equal(state["w"], torch.full_like(weights, step))


def _copy_seconds(tensor: torch.Tensor) -> float:
    target = torch.empty_like(tensor)
    began = time.perf_counter()
    target.copy_(tensor)
    return time.perf_counter() - began


def test_a_small_replica_is_not_held_by_nagle_and_delayed_acks(tmp_path: Path) -> None:
    """A put is small writes then a read: without TCP_NODELAY on both ends each put of a
    small shard took 44 ms on loopback (the peer's delayed ACK), and a worker waiting
    for its replication paid that every step."""
    from rtrain.agent.snapshots.checksums import checksums
    from rtrain.agent.snapshots.peers.client import ShardClient
    from rtrain.core.snapshots.format import plan_shard, write_shard

    layout = plan_shard({"w": torch.ones(3000), "step": 1})
    data = bytearray(layout.size)
    write_shard(data, layout, 1)
    crcs = checksums(data, layout.size)
    receiver = ShardStore(str(tmp_path), budget=2**26)
    server = ShardServer("127.0.0.1", SECRET, receiver)
    client = ShardClient("127.0.0.1", server.port, SECRET)
    took = []
    try:
        for step in range(1, 12):
            began = time.perf_counter()
            client.put(ShardId(0, 0, step), data, layout.size, crcs)
            took.append(time.perf_counter() - began)
    finally:
        client.close()
        server.close()
    took.sort()
    assert took[len(took) // 2] < 0.03, took
