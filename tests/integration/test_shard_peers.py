"""Shard servers against strangers and against replicas their senders never sent: real
ShardServers over TCP from other loopback addresses, and live jobs attacked as they
train (issue 32: strangers locked real peers out; a replica ahead of its sender
blocked the sender's genuine stream until its worker was killed as hung)."""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import socket
import threading
import time

import pytest
import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers import server as shard_server
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.wire import MAGIC, ShardError, recv_message, send_message
from rtrain.core.rendezvous.protocol import StoreKeys, decode_master
from rtrain.core.snapshots.format import (
    COMMITTED,
    HEADER_SIZE,
    plan_shard,
    read_header,
    write_shard,
)
from rtrain.core.snapshots.restore_plan import ShardId
from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.conftest import SNAPSHOT_FLAGS, SNAPSHOT_STEPS
from tests.integration.shard_peer_helpers import SECRET, get, put

STRANGER = "127.0.0.9"


def shard(value: float, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((100,), value), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


def hello(sock: socket.socket) -> bool:
    """Whether the server began a handshake on this connection (sent its challenge)."""
    sock.settimeout(5)
    try:
        return sock.recv(len(MAGIC)) == MAGIC
    except OSError:
        return False


def test_a_stranger_gets_no_handshake_and_a_members_flood_takes_only_its_own_places(guarded):
    store, server = guarded
    strangers = [socket.create_connection(("127.0.0.1", server.port), 5, (STRANGER, 0))]
    strangers += [
        socket.create_connection(("127.0.0.1", server.port), 5, (STRANGER, 0))
        for _ in range(shard_server.MAX_UNAUTHENTICATED)
    ]
    flood = [
        socket.create_connection(("127.0.0.1", server.port), 5, ("127.0.0.1", 0))
        for _ in range(shard_server.MAX_UNAUTHENTICATED + 8)
    ]
    try:
        assert not any(hello(sock) for sock in strangers)  # closed before the handshake
        assert server.refusals["stranger"] == len(strangers)
        # 127.0.0.1 (a member's address) holds all the places it may have: the
        # sender's own connection still gets in at once, and is served.
        put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(1.0, 10))
        assert server.refusals["flood"] >= 8
        assert [s for s, _ in store.replicas()] == [ShardId(3, 1, 10)]
    finally:
        for sock in strangers + flood:
            sock.close()


def test_a_replica_ahead_of_its_sender_does_not_block_the_step_it_sends_next(guarded):
    store, server = guarded
    put(server.port, "127.0.0.2", ShardId(3, 1, 8), shard(8.0, 8))
    # One put of a step the sender has not reached, with the secret from its address.
    put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(-1.0, 10))
    # The sender's own stream goes on: step 9 (refused as "older" before), then 10.
    put(server.port, "127.0.0.2", ShardId(3, 1, 9), shard(9.0, 9))
    assert sorted(s.step for s, _ in store.replicas()) == [8, 9]  # the unconfirmed 10 went
    assert server.refusals["unconfirmed"] == 1
    put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(10.0, 10))
    assert sorted(s.step for s, _ in store.replicas()) == [9, 10]
    assert get(server.port, "127.0.0.1", ShardId(3, 1, 10)) == shard(10.0, 10)
    # A step older than one its sender went past is still refused (a replay).
    with pytest.raises(ShardError, match="older than the replica kept"):
        put(server.port, "127.0.0.2", ShardId(3, 1, 8), shard(8.0, 8))
    assert sorted(s.step for s, _ in store.replicas()) == [9, 10]


def test_overlapping_puts_of_one_rank_each_write_their_own_file(guarded, tmp_path):
    """A put of step 11 lands while the sender's step 9 is half received: before, both
    went into the same replica file, and the genuine one failed its checksum."""
    store, server = guarded
    put(server.port, "127.0.0.2", ShardId(3, 1, 8), shard(8.0, 8))
    layout = plan_shard({"w": torch.arange(1 << 20, dtype=torch.float32), "step": 9})
    data = bytearray(layout.size)
    write_shard(data, layout, 9)
    slow = ShardClient("127.0.0.1", server.port, SECRET, "127.0.0.2")
    try:
        header = {"op": "put", "gen": 3, "rank": 1, "step": 9, "size": len(data)}
        header["crcs"] = checksums(data, len(data))
        send_message(slow._sock, header, memoryview(data)[: len(data) // 2])
        end = time.monotonic() + 10
        while not any(p.stat().st_size >= len(data) for p in tmp_path.rglob("g3_r1.rep*")):
            assert time.monotonic() < end, "the server never began receiving step 9"
            time.sleep(0.01)
        put(server.port, "127.0.0.2", ShardId(3, 1, 11), shard(-1.0, 11))
        slow._sock.sendall(memoryview(data)[len(data) // 2 :])
        assert recv_message(slow._sock) == {"ok": True, "error": ""}
    finally:
        slow.close()
    found = store.open_shard(ShardId(3, 1, 9))
    assert found is not None and bytes(found[0][: found[1]]) == bytes(data)
    assert server.refusals["mismatch"] == 0


def test_each_refusal_reason_has_its_own_log_line(guarded, caplog):
    _, server = guarded
    caplog.set_level(logging.WARNING, logger=shard_server.__name__)
    for step in (8, 9):
        put(server.port, "127.0.0.2", ShardId(3, 1, step), shard(1.0, step))
    for source, which, match in [
        ("127.0.0.1", ShardId(3, 1, 10), "does not replicate"),
        ("127.0.0.1", ShardId(3, 1, 10), "does not replicate"),  # the same: no new line
        ("127.0.0.2", ShardId(3, 1, 99), "beyond any step"),
        ("127.0.0.2", ShardId(3, 1, 7), "older than"),
        ("127.0.0.2", ShardId(2, 1, 9), "not the current one"),
    ]:
        with pytest.raises(ShardError, match=match):
            put(server.port, source, which, shard(1.0, which.step))
    with pytest.raises(ShardError):
        put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(1.0, 10), b"not the secret")
    with contextlib.closing(
        socket.create_connection(("127.0.0.1", server.port), 5, (STRANGER, 0))
    ) as sock:
        assert not hello(sock)
    lines = [r.getMessage() for r in caplog.records if r.name == shard_server.__name__]
    for fragment in (
        "does not replicate",
        "beyond any step",
        "older than",
        "not the current one",
        "without the job secret",
        f"{STRANGER} is not a member",
    ):
        assert sum(fragment in line for line in lines) == 1, (fragment, lines)
    assert server.refusals["put"] == 5


# -- live jobs --------------------------------------------------------------------------


def store_client(cluster: LocalCluster):
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1", cluster.port, is_master=False, timeout=datetime.timedelta(seconds=30)
    )


def shard_port(store, node_rank: int) -> int:
    return decode_master(store.get(StoreKeys("recovery").shards(0, node_rank)))[1]


def digests(cluster: LocalCluster) -> set[str]:
    return {json.loads(p.read_text())["digest"] for p in cluster.out.glob("final_rank*.json")}


class Strangers:
    """A non-member that keeps MAX_UNAUTHENTICATED connections open to each of these
    shard servers, each opened again shortly after the server closes it."""

    def __init__(self, ports: list[int]) -> None:
        self.stop = threading.Event()
        self.connections = 0
        self.handshakes = 0  # connections the server began a handshake on
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._hold, args=(port,), daemon=True)
            for port in ports
            for _ in range(shard_server.MAX_UNAUTHENTICATED)
        ]
        for thread in self._threads:
            thread.start()

    def _hold(self, port: int) -> None:
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", port), 5, (STRANGER, 0))
            except OSError:
                self.stop.wait(0.2)
                continue
            with sock:
                began = hello(sock)
                with self._lock:
                    self.connections += 1
                    self.handshakes += began
                sock.settimeout(1)
                while began and not self.stop.is_set():  # until the server cuts it off
                    try:
                        if not sock.recv(64):
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
            self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


def test_strangers_holding_handshakes_do_not_lock_members_out_across_a_restart(
    tmp_path, snapshot_reference
):
    """A non-member keeps 32 handshakes open on both nodes' shard servers (5 s each,
    reopened) while a worker crashes: before, node 0's replicator could not reach node 1
    after the restart (no step for ~10 s) and the `recovery` event said 1 s down."""
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, "--max-restarts=1"],
        script=SNAPSHOTTING,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.1",
        PROBE_FAULT="rank=0,step=14,gen=0,action=exit",
    )
    strangers = None
    try:
        cluster.wait_progress(3)
        store = store_client(cluster)
        strangers = Strangers([shard_port(store, 0), shard_port(store, 1)])
        codes = cluster.wait()
    finally:
        if strangers is not None:
            strangers.close()
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert codes == [0, 0], logs
    assert digests(cluster) == {snapshot_reference.final}, logs
    assert strangers.connections > 0 and strangers.handshakes == 0
    faults = cluster.events("fault")
    assert {e.generation for e in faults} == {0}, faults
    assert not [e for e in faults if e["kind"] in ("hung", "lost_node")], faults
    # Each node's recovery lasted until its workers' first step after the restart.
    ends = {e.agent: e.t for e in cluster.events("generation_end") if e.generation == 0}
    recoveries = {e.agent: e for e in cluster.events("recovery")}
    assert sorted(recoveries) == ["127.0.0.1", "127.0.0.2"], recoveries
    for agent, ranks in (("127.0.0.1", (0, 1)), ("127.0.0.2", (2, 3))):
        recovery = recoveries[agent]
        first = [
            json.loads((cluster.out / f"first_step_gen1_rank{r}.json").read_text()) for r in ranks
        ]
        assert recovery["at_step"] >= min(f["step"] for f in first), recovery
        assert recovery.t >= min(f["t"] for f in first), (recovery, first)
        assert abs(recovery.t - recovery["down_s"] - ends[agent]) < 0.5, (recovery, ends)


def slot_steps(cluster: LocalCluster, node: int, rank: int) -> int | None:
    """The newest step rank `rank` committed in generation 0 on node `node`."""
    pattern = f"/dev/shm/rtrain-run-{cluster.procs[node].pid}-*/shards/snap/gen0/rank{rank}.slot*"
    steps = []
    for path in glob.glob(pattern):
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            header = read_header(handle.read(HEADER_SIZE))
            if header is not None and header.state == COMMITTED:
                steps.append(header.step)
    return max(steps, default=None)


def test_a_replica_ahead_of_its_sender_does_not_stall_a_live_job(tmp_path, snapshot_reference):
    """One put of a step node 1's rank 2 has not reached, forged with the secret the
    store hands out and sent from node 1's address to node 0: before, every genuine put
    of rank 2 after it was "older than the replica kept", its worker waited in
    snapshot() until it was killed as hung, and the restart was charged to node 1."""
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*SNAPSHOT_FLAGS, "--hang-timeout=10"],
        script=SNAPSHOTTING,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.1",
    )
    forged = None
    try:
        cluster.wait_progress(4)
        store = store_client(cluster)
        secret = store.get(StoreKeys("recovery").secret)
        port = shard_port(store, 0)
        end = time.monotonic() + 20
        while forged is None and time.monotonic() < end:
            time.sleep(0.01)
            newest = slot_steps(cluster, 1, 2)
            if newest is None:
                continue
            ahead = ShardId(0, 2, newest + 2)
            try:
                put(port, "127.0.0.2", ahead, shard(-1.0, ahead.step), secret)
            except ShardError:  # "beyond" until node 0's own workers reached newest
                continue
            if slot_steps(cluster, 1, 2) == newest:  # node 1 sends newest + 1 after it
                forged = ahead
        codes = cluster.wait()
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert forged is not None, logs
    assert codes == [0, 0], logs
    assert digests(cluster) == {snapshot_reference.final}, logs
    assert cluster.events("fault") == [] and cluster.events("recovery") == [], logs
    assert "dropped the replica of rank 2" in cluster.log(0)
