"""Shard storage and transfer under faults, with the real ShardServer over TCP, real
shared-memory files, and real processes killed in the middle of a snapshot."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import Peers, TcpTransport
from rtrain.agent.snapshots.peers.wire import ShardError
from rtrain.agent.snapshots.restore.copies import restore_once
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.layout.topology import Layout, NodeSlot, build_grid, recompute_topology
from rtrain.core.snapshots.format import WAKE_FIFO, plan_shard, read_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.worker.snapshots import restore, slot_paths

SECRET = b"0123456789abcdef0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


def shard_bytes(value: float, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((1000,), value), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


@pytest.fixture
def node(tmp_path):
    """A node's shard store and its server; closed after the test."""
    servers = []

    def make(name: str) -> tuple[ShardStore, ShardServer]:
        store = ShardStore(str(tmp_path / name), budget=0)
        server = ShardServer("127.0.0.1", SECRET, store)
        servers.append(server)
        return store, server

    yield make
    for server in servers:
        server.close()


def put(server: ShardServer, shard: ShardId, buffer: bytearray) -> None:
    client = ShardClient("127.0.0.1", server.port, SECRET)
    try:
        client.put(shard, buffer, len(buffer), checksums(buffer, len(buffer)))
    finally:
        client.close()


def test_replica_round_trip_and_newest_two_steps_kept(node):
    store, server = node("a")
    for step in (1, 2, 3):
        put(server, ShardId(0, 5, step), shard_bytes(step, step))
    assert sorted(s.step for s, _ in store.replicas()) == [2, 3]
    client = ShardClient("127.0.0.1", server.port, SECRET)
    got: list[bytearray] = []
    client.get(ShardId(0, 5, 3), lambda size: got.append(bytearray(size)) or got[-1])
    client.close()
    state, step = read_shard(got[0])
    assert step == 3 and torch.equal(state["w"], torch.full((1000,), 3.0))


def test_a_client_without_the_secret_gets_nothing(node):
    _, server = node("a")
    put(server, ShardId(0, 1, 1), shard_bytes(1, 1))
    with pytest.raises(ShardError, match="does not accept this job's secret"):
        ShardClient("127.0.0.1", server.port, b"wrong secret")
    # a raw connection that answers the challenge with garbage is dropped, unanswered
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.recv(36)
        raw.sendall(b"\0" * 64 + b'{"op": "get", "gen": 0, "rank": 1, "step": 1}')
        assert raw.recv(100) == b""


def test_a_server_that_answers_garbage_is_refused():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 100)
        time.sleep(0.5)
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    with pytest.raises(ShardError, match="not an rtrain shard server"):
        ShardClient("127.0.0.1", listener.getsockname()[1], SECRET)
    listener.close()


def test_a_corrupt_replica_is_refused_and_restore_takes_the_next_holder(node, caplog):
    store_a, server_a = node("a")
    store_b, server_b = node("b")
    store_new, _ = node("new")
    good = shard_bytes(2.5, 4)
    for server in (server_a, server_b):
        put(server, ShardId(0, 0, 4), good)
    # flip a byte in a's copy, behind the store's back (bad memory, a stray write)
    path = next(p for s, p in store_a.replicas())
    with open(path, "r+b") as handle:
        handle.seek(len(good) - 10)
        handle.write(b"\xff")
    # a replacement node restores rank 0 of generation 1: holders are a (0) and b (1)
    before = build_grid(Layout(), 0, [NodeSlot("old", 1)])
    topo = recompute_topology(Layout(), 1, [NodeSlot("new", 1)], before)
    inventory = {0: store_a.inventory(), 1: store_b.inventory(), 2: []}
    servers = {0: ("127.0.0.1", server_a.port), 1: ("127.0.0.1", server_b.port)}
    peers = Peers(TcpTransport(SECRET), servers)
    result = restore_once(store_new, peers, _only_node(topo, 2), 2, inventory)
    assert result.step == 4 and result.fetched == 1
    assert "failed its checksum" in caplog.text
    slot = slot_paths(store_new.snap_dir(1), 0)[0]
    state, step = read_shard(bytearray(Path(slot).read_bytes()))
    assert step == 4 and torch.equal(state["w"], torch.full((1000,), 2.5))


def _only_node(topo, node_rank):
    """The topology with its single node at `node_rank` (the other nodes hold replicas)."""
    from dataclasses import replace

    coords = tuple(replace(c, node_rank=node_rank) for c in topo.coords)
    return replace(topo, coords=coords)


WRITER = """
import os, sys, threading, time, torch
from rtrain.core.worker.snapshots import snapshot, slot_paths
from rtrain.core.snapshots.format import read_header, replicated_step, set_replicated
import mmap

def agent():  # what the agent's replicator does: mark each committed slot replicated
    while True:
        for path in slot_paths(os.environ["RTRAIN_SNAPSHOT_DIR"], 0):
            if os.path.exists(path) and os.path.getsize(path):
                with open(path, "r+b") as f:
                    m = mmap.mmap(f.fileno(), 0)
                    h = read_header(m)
                    if h and h.state == 2 and replicated_step(m) < h.step:
                        set_replicated(m, h.step)
                    m.close()
        time.sleep(0.001)

threading.Thread(target=agent, daemon=True).start()
big = torch.empty(int(sys.argv[1]) * 2**20 // 4)
step = 0
while True:
    big.fill_(float(step))
    snapshot({"w": big, "step": step}, step)
    print(step, flush=True)
    step += 1
"""


def test_a_worker_killed_mid_snapshot_leaves_the_previous_one_whole(tmp_path):
    env = {**os.environ, "RTRAIN_SNAPSHOT_DIR": str(tmp_path), "RANK": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, "200"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for _ in range(3):  # a few whole snapshots, then kill it while it writes the next
        proc.stdout.readline()
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.environ["RTRAIN_SNAPSHOT_DIR"], os.environ["RANK"] = str(tmp_path), "0"
    try:
        state, step = restore()
    finally:
        del os.environ["RTRAIN_SNAPSHOT_DIR"], os.environ["RANK"]
    assert step >= 2 and state["step"] == step
    assert torch.all(state["w"] == float(step))  # no torn tensor: every value from one step


SHM_FULL = """
import resource, signal, sys, torch
from rtrain.core.worker.snapshots import snapshot, SnapshotError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # the file system is "full" at 1 MiB
try:
    snapshot({"w": torch.zeros(2**20)}, 0)
except SnapshotError as exc:
    print(exc)
    sys.exit(7)
"""


def test_no_room_for_a_snapshot_is_a_clear_error(tmp_path):
    env = {**os.environ, "RTRAIN_SNAPSHOT_DIR": str(tmp_path), "RANK": "0"}
    result = subprocess.run(
        [sys.executable, "-c", SHM_FULL], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 7, result.stderr
    assert "no room for a 4.0 MiB snapshot" in result.stdout


def test_a_snapshot_over_the_budget_is_refused(tmp_path, monkeypatch):
    import rtrain.core.worker.snapshots as api

    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", str(tmp_path))
    monkeypatch.setenv("RTRAIN_SNAPSHOT_BUDGET", str(1 << 20))
    with pytest.raises(
        api.SnapshotError, match="does not fit this rank's share of --snapshot-memory"
    ):
        api.snapshot({"w": torch.zeros(2**20)}, 0)


def test_old_slots_are_recycled_wiped_and_never_restored(tmp_path, monkeypatch):
    """After a restart the agent hands old slot files to the new workers: the adopted
    shard and the restored step stay, and a newer step that not every rank had (rank 0
    wrote step 9, the plan restored 8) is wiped, so restore() cannot return it."""
    store = ShardStore(str(tmp_path / "node"), budget=0)
    old = store.snap_dir(0)
    for rank, steps in ((0, (8, 9)), (1, (7, 8))):
        for path, step in zip(slot_paths(old, rank)[:2], steps, strict=True):
            Path(path).write_bytes(shard_bytes(float(step), step))
    store.adopt(ShardId(0, 0, 8), generation=1, rank=0)

    assert store.recycle(1, ranks=[0, 1], keep_step=8) == 2
    new = store.snap_dir(1)
    recycled = sorted(p.name for p in Path(new).iterdir())
    assert recycled == ["rank0.slot0", "rank0.slot1", "rank1.slot1"]
    assert Path(old, "rank0.slot0").exists() and Path(old, "rank1.slot1").exists()  # kept
    assert [s for s, _ in store.local_slots() if s.generation == 1] == [ShardId(1, 0, 8)]

    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", new)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("rtrain.core.worker.snapshots._slots", None)
    restored = restore()
    assert restored is not None and restored[1] == 8
    assert torch.equal(restored[0]["w"], torch.full((1000,), 8.0))


REWRITER = """
import mmap, os, struct, sys, time
from rtrain.core.snapshots.format import COMMITTED, HEADER, MAGIC, VERSION, WRITING, read_header
from rtrain.core.snapshots.header import STATE_OFFSET
with open(sys.argv[1], "r+b") as handle:
    slot = mmap.mmap(handle.fileno(), 0)
old = read_header(slot)
# Like a worker after each commit, it wakes the replicator, so a pass follows each one.
wake = os.open(sys.argv[3], os.O_WRONLY | os.O_NONBLOCK)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    # A worker starts rewriting this (already replicated) slot for a newer step: the
    # header first (replicated reset), then the data...
    sizes = (old.meta_len, old.data_len)
    HEADER.pack_into(slot, 0, MAGIC, VERSION, WRITING, old.step + 2, *sizes, -1)
    slot[-1] ^= 0xFF
    # ... and, to do it again and again, the slot is put back as it was, in the order a
    # worker commits: the header while the state still says WRITING, the state last.
    # (One pack_into of a COMMITTED header zeroes all 48 bytes and then writes them in
    # order: read between the step and the replicated mark, it shows a committed step
    # never replicated, a header no worker writes.)
    slot[-1] ^= 0xFF
    HEADER.pack_into(slot, 0, MAGIC, VERSION, WRITING, old.step, *sizes, old.step)
    struct.pack_into("<I", slot, STATE_OFFSET, COMMITTED)
    try:
        os.write(wake, b"w")
    except BlockingIOError:
        pass  # the FIFO is full: a pass is due anyway
"""


def test_a_slot_a_worker_starts_rewriting_is_not_sent_as_its_old_step(node):
    """The replicator reads a slot's header while a worker (a real process on the real
    slot file) keeps starting to rewrite it: read apart, the old step looked committed
    and unreplicated, and a torn copy went out (the audit's false checksum mismatches)."""
    from rtrain.agent.snapshots.replication.replicator import Replicator
    from rtrain.core.snapshots.format import set_replicated

    store_a, _ = node("a")
    store_b, server_b = node("b")
    slots = slot_paths(store_a.snap_dir(0), 0)
    for path, step in zip(slots[:2], (1, 2), strict=True):
        data = shard_bytes(step, step)
        set_replicated(data, step)  # both already replicated
        Path(path).write_bytes(data)
    replicator = Replicator(store_a, TcpTransport(SECRET))
    replicator.follow(0, [("127.0.0.1", server_b.port)], world_size=1, local_ranks=1)
    try:
        wake = os.path.join(store_a.snap_dir(0), WAKE_FIFO)
        subprocess.run(
            [sys.executable, "-c", REWRITER, slots[0], "3", wake], check=True, timeout=60
        )
    finally:
        replicator.close()
    assert store_b.replicas() == [] and server_b.refusals["mismatch"] == 0


STEADY_WRITER = """
import sys, torch
from rtrain.core.worker.snapshots import snapshot
big = torch.empty(int(sys.argv[1]) * 2**18)
for step in range(int(sys.argv[2])):
    big.fill_(float(step))
    snapshot({"w": big, "step": step}, step)
"""


def test_a_slot_rewritten_while_it_is_replicated_is_never_a_checksum_mismatch(node, caplog):
    """A real worker snapshots as fast as it can while the real Replicator sends every
    step to a real ShardServer: a mismatch may only ever mean corruption, so there is
    none, and every replica kept holds one whole step."""
    from rtrain.agent.snapshots.replication.replicator import Replicator

    store_a, _ = node("a")
    store_b, server_b = node("b")
    replicator = Replicator(store_a, TcpTransport(SECRET))
    replicator.follow(0, [("127.0.0.1", server_b.port)], world_size=1, local_ranks=1)
    env = {**os.environ, "RTRAIN_SNAPSHOT_DIR": store_a.snap_dir(0), "RANK": "0"}
    try:
        subprocess.run(
            [sys.executable, "-c", STEADY_WRITER, "1", "600"], env=env, check=True, timeout=300
        )
    finally:
        replicator.close()
    assert server_b.refusals["mismatch"] == 0
    assert "checksum" not in caplog.text
    kept = store_b.replicas()
    assert kept
    for which, path in kept:
        state, step = read_shard(bytearray(Path(path).read_bytes()))
        assert step == which.step == state["step"] and torch.all(state["w"] == float(step))


class CutOffProxy:
    """Forwards a connection to a shard server and cuts both ends off once `limit`
    bytes came back from the server: a holder that dies in the middle of a shard."""

    def __init__(self, port: int, limit: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        threading.Thread(target=self._serve, args=(port, limit), daemon=True).start()

    def _serve(self, port: int, limit: int) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", port))

        def upstream() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    server.sendall(data)

        threading.Thread(target=upstream, daemon=True).start()
        sent = 0
        with contextlib.suppress(OSError):
            while sent < limit and (data := server.recv(min(65536, limit - sent))):
                client.sendall(data)
                sent += len(data)
        self.cut.set()
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def fetch_through_agent(monkeypatch, local: ShardStore, context) -> dict:
    """A worker's fetch_previous_shards against a PeerFetcher polled as the replicator would."""
    from rtrain.agent.snapshots.restore.fetcher import PeerFetcher
    from rtrain.core.worker.peer_shards import fetch_previous_shards

    fetcher = PeerFetcher(local)
    fetcher.follow(context)
    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", local.snap_dir(context.generation))
    monkeypatch.setenv("RANK", "0")
    done = threading.Event()

    def replicator_passes() -> None:
        while not done.is_set():
            fetcher.poll()
            time.sleep(0.002)

    threading.Thread(target=replicator_passes, daemon=True).start()
    try:
        return fetch_previous_shards(7, [3], timeout=30)
    finally:
        done.set()


def test_a_dcp_read_whose_holder_dies_mid_transfer_or_sends_a_corrupt_copy_takes_the_next(
    node, tmp_path, monkeypatch
):
    from rtrain.agent.snapshots.restore.shard_fetch import FetchContext

    shard = ShardId(1, 3, 7)  # rank 3's shard of step 7 in generation 1; now generation 2
    layout = plan_shard({"w": torch.full((3 << 20,), 3.0)})  # 12 MiB: cut in the middle
    data = bytearray(layout.size)
    write_shard(data, layout, 7)
    _, dying_server = node("dying")
    corrupt, corrupt_server = node("corrupt")
    _, intact_server = node("intact")
    for server in (dying_server, corrupt_server, intact_server):
        put(server, shard, data)
    (path,) = [p for s, p in corrupt.replicas() if s == shard]
    with open(path, "r+b") as handle:  # a flipped byte in the holder's memory
        handle.seek(5 << 20)
        byte = handle.read(1)[0]
        handle.seek(5 << 20)
        handle.write(bytes([byte ^ 0x40]))
    proxy = CutOffProxy(dying_server.port, limit=2 << 20)
    local = ShardStore(str(tmp_path / "local"), budget=0)
    context = FetchContext(
        generation=2,
        node_rank=0,
        local_ranks=[0],
        holders={shard: [1, 2, 3]},
        servers={
            1: ("127.0.0.1", proxy.port),
            2: ("127.0.0.1", corrupt_server.port),
            3: ("127.0.0.1", intact_server.port),
        },
        transport=TcpTransport(SECRET),
    )
    try:
        found = fetch_through_agent(monkeypatch, local, context)
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    state, step = found[3]
    assert step == 7 and torch.equal(state["w"], torch.full((3 << 20,), 3.0))
    # Nothing of the failed attempts is left in the worker's folder.
    assert not [p for p in os.listdir(local.snap_dir(2)) if p.startswith("fetched-")]


def test_a_dcp_read_with_no_intact_copy_names_the_rank(node, tmp_path, monkeypatch):
    from rtrain.agent.snapshots.restore.shard_fetch import FetchContext
    from rtrain.core.snapshots.format import SnapshotError

    local = ShardStore(str(tmp_path / "local"), budget=0)
    context = FetchContext(2, 0, [0], {}, {}, TcpTransport(SECRET))
    with pytest.raises(SnapshotError, match="no intact copy of rank 3's shard of step 7"):
        fetch_through_agent(monkeypatch, local, context)


def ddp_shard(rank: int, step: int, weights: torch.Tensor) -> bytearray:
    """A DDP rank's shard: parameters all ranks share, then its own RNG and note."""
    rng = torch.full((5056,), rank, dtype=torch.uint8)
    layout = plan_shard({"model": {"w": weights}, "rng": rng, "note": f"rank {rank}" * rank})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


def twin_slot(store: ShardStore, generation: int, rank: int, data: bytearray) -> Path:
    """The receiving node's own worker's committed slot, as its worker writes it."""
    path = Path(slot_paths(store.snap_dir(generation), rank)[0])
    path.write_bytes(bytes(data))
    return path


def test_a_replica_to_its_dp_twins_node_sends_only_the_chunks_the_twin_lacks(node):
    store, server = node("b")
    weights = torch.randn(10 << 20)  # 40 MiB of shared parameters: five data chunks
    mine, twins = ddp_shard(0, 4, weights), ddp_shard(1, 4, weights)
    twin_slot(store, 0, 1, twins)
    client = ShardClient("127.0.0.1", server.port, SECRET)
    try:
        sent = client.put(
            ShardId(0, 0, 4), mine, len(mine), checksums(mine, len(mine)), ShardId(0, 1, 4)
        )
        # Under FSDP the twin holds other bytes: everything travels, and is right.
        other = ddp_shard(0, 5, torch.randn(10 << 20))
        sent_other = client.put(
            ShardId(0, 0, 5), other, len(other), checksums(other, len(other)), ShardId(0, 1, 4)
        )
    finally:
        client.close()
    assert sent < 0.25 * len(mine)  # the skeleton and the last chunk, with the RNG
    assert sent_other >= len(other)
    for shard, data in ((ShardId(0, 0, 4), mine), (ShardId(0, 0, 5), other)):
        found = store.open_shard(shard)
        assert found is not None and bytes(found[0][: found[1]]) == bytes(data)


def test_a_base_rewritten_under_the_replica_is_refused_and_a_missing_one_sends_all(node):
    store, server = node("b")
    weights = torch.randn(4 << 20)
    mine = ddp_shard(0, 4, weights)
    client = ShardClient("127.0.0.1", server.port, SECRET)
    try:
        # No twin slot of step 4 here (the twin is slower, or runs another stage).
        sent = client.put(
            ShardId(0, 0, 4), mine, len(mine), checksums(mine, len(mine)), ShardId(0, 1, 4)
        )
        assert sent >= len(mine)
        # A planted "twin" slot whose digests were taken before a byte flipped: the
        # server copies the flipped byte, and the whole-replica check refuses it.
        planted = ddp_shard(1, 6, weights)
        path = twin_slot(store, 0, 1, planted)
        store.remember_crcs(ShardId(0, 1, 6), checksums(planted, len(planted)))
        flipped = bytearray(path.read_bytes())
        flipped[len(flipped) // 2] ^= 1
        path.write_bytes(bytes(flipped))
        with pytest.raises(ShardError, match="checksum mismatch"):
            client.put(
                ShardId(0, 0, 6), mine, len(mine), checksums(mine, len(mine)), ShardId(0, 1, 6)
            )
    finally:
        client.close()
    assert store.open_shard(ShardId(0, 0, 6)) is None
