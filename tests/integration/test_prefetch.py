"""The shards a resharding load will read, fetched by the agent before the workers start
(agent/snapshots/restore/prefetch.py): real ShardServers over TCP, real shared-memory
files, the worker's real fetch_previous_shards. A counting proxy in front of the peer
says how many connections the worker's load caused."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest
import torch

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.restore.fetcher import PeerFetcher
from rtrain.agent.snapshots.restore.shard_fetch import FetchContext
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.contract.dcp_index import MARK, Item, SaveIndex
from rtrain.core.contract.peer_shards import prefetched_name
from rtrain.core.snapshots.dcp_reads import writers_read
from rtrain.core.snapshots.format import plan_shard, write_shard
from rtrain.core.snapshots.restore_plan import ShardId
from rtrain.core.worker.peer_shards import fetch_previous_shards

SECRET = b"0123456789abcdef0123456789abcdef"
STEP, ROWS, WIDTH = 7, 33, 1000  # 33 rows over 3 writers (11 each), read by 2 ranks


def saved_index() -> SaveIndex:
    """A 3-writer save of one (33, WIDTH) tensor cut along dim 0, and a value on writer 2."""
    items = [
        Item(w, 0, "w", (11 * w, 0), "s", (11 * w, 0), (11, WIDTH), "float32", (ROWS, WIDTH), False)
        for w in range(3)
    ]
    items.append(Item(2, 1, "data.next", None, "b", None, None, None, None, False))
    return SaveIndex("abc123", 3, STEP, tuple(items), None)


def whole() -> torch.Tensor:
    return torch.arange(ROWS * WIDTH, dtype=torch.float32).reshape(ROWS, WIDTH)


def shard_of(writer: int) -> bytearray:
    items: dict[int, object] = {0: whole()[11 * writer : 11 * (writer + 1)].clone()}
    if writer == 2:
        items[1] = STEP + 1
    state = {MARK: {"index": saved_index().to_json(), "writer": writer}, "items": items}
    layout = plan_shard(state)
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, STEP)
    return buffer


class CountingProxy:
    """A peer's address: forwards to its server while up, refuses (closes at once)
    while down; counts the connections made to it."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.hold: threading.Event | None = None  # set: connections wait for it
        self.connections = 0
        self._target = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                self.connections += 1
                if not self.up:
                    client.close()
                    continue
                threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        if self.hold is not None:
            self.hold.wait(30)
        server = socket.create_connection(("127.0.0.1", self._target))
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """Node 0 of generation 2 (world 2, rank 0: its own writer-0 shard restored into its
    slot) and node 1, which holds writers 1 and 2's shards, behind a counting proxy."""
    peer = ShardStore(str(tmp_path / "peer"), budget=0)
    server = ShardServer("127.0.0.1", SECRET, peer)
    for writer in (1, 2):
        data = shard_of(writer)
        client = ShardClient("127.0.0.1", server.port, SECRET)
        try:
            client.put(ShardId(1, writer, STEP), data, len(data), checksums(data, len(data)))
        finally:
            client.close()
    proxy = CountingProxy(server.port)
    local = ShardStore(str(tmp_path / "local"), budget=0)
    directory = local.snap_dir(2)
    with open(os.path.join(directory, "rank0.slot0"), "wb") as handle:
        handle.write(shard_of(0))
    context = FetchContext(
        generation=2,
        node_rank=0,
        local_ranks=[0],
        holders={ShardId(1, w, STEP): [1] for w in (1, 2)},
        servers={1: ("127.0.0.1", proxy.port)},
        transport=TcpTransport(SECRET),
        world_size=2,
    )
    fetcher = PeerFetcher(local)
    fetcher.follow(context)
    monkeypatch.setenv("RTRAIN_SNAPSHOT_DIR", directory)
    monkeypatch.setenv("RANK", "0")
    yield fetcher, proxy, directory
    proxy.close()
    server.close()


def loaded(found: dict) -> torch.Tensor:
    """Rows 0-16 of the tensor as rank 0 of 2 reads them, from writers 0 and 1's chunks."""
    state1, step = found[1]
    assert step == STEP and found[2][0]["items"][1] == STEP + 1
    return torch.cat([whole()[:11], state1["items"][0][:6]])


def test_the_predicted_writers_are_fsdps_rows_and_the_values_writer() -> None:
    index = saved_index()
    assert writers_read(index, 0, 2) == {0, 1, 2}  # rows 0-16, and writer 2's value
    assert writers_read(index, 1, 2) == {1, 2}  # rows 17-32
    assert writers_read(index, 2, 3) == {2}  # the saving world: its own shard only


def test_after_the_prefetch_the_load_reads_local_memory_with_no_peer_fetch(setup) -> None:
    fetcher, proxy, directory = setup
    done = fetcher.prefetch()
    assert done is not None and done.finished.wait(30)
    assert (done.fetched, done.failed) == (2, 0)
    assert sorted(s.rank for s in done.files) == [1, 2]
    before = proxy.connections
    # No replicator passes: a request to the agent would never be answered.
    found = fetch_previous_shards(STEP, [1, 2], timeout=2)
    assert proxy.connections == before  # zero peer fetches during the load
    assert torch.equal(loaded(found), whole()[:17])
    fetcher.committed(STEP)  # the restored step again (its replication): files kept
    assert os.path.exists(os.path.join(directory, prefetched_name(1, STEP)))
    fetcher.committed(STEP + 1)  # a newer step: the load is over, the files go
    assert not any(n.startswith("prefetched-") for n in os.listdir(directory))


def test_a_prefetch_whose_peer_is_gone_falls_back_to_the_on_demand_fetch(setup) -> None:
    fetcher, proxy, directory = setup
    proxy.up = False  # the peer is gone while the prefetch runs
    done = fetcher.prefetch()
    assert done is not None and done.finished.wait(30)
    assert (done.fetched, done.failed) == (0, 2)
    assert not any(n.startswith("prefetched-") for n in os.listdir(directory))
    proxy.up = True
    before = proxy.connections
    stop = threading.Event()

    def replicator_passes() -> None:
        while not stop.is_set():
            fetcher.poll()
            time.sleep(0.002)

    threading.Thread(target=replicator_passes, daemon=True).start()
    try:
        found = fetch_previous_shards(STEP, [1, 2], timeout=30)
    finally:
        stop.set()
    assert proxy.connections - before == 2  # both fetched on demand, during the load
    assert torch.equal(loaded(found), whole()[:17])  # the same result


def test_a_load_that_starts_while_the_prefetch_runs_waits_for_it(setup) -> None:
    # The workers start while the transfers run: a load that wants a shard still on
    # its way waits for its file instead of asking for it (no replicator passes here:
    # a request would never be answered). The peer answers once the load is waiting.
    fetcher, proxy, directory = setup
    proxy.hold = threading.Event()
    done = fetcher.prefetch()
    assert done is not None and not done.finished.is_set()
    assert os.path.exists(os.path.join(directory, prefetched_name(1, STEP) + ".pending"))
    got: dict = {}
    loading = threading.Thread(
        target=lambda: got.update(fetch_previous_shards(STEP, [1, 2], timeout=30))
    )
    loading.start()
    proxy.hold.set()
    loading.join(60)
    assert done.finished.is_set() and (done.fetched, done.failed) == (2, 0)
    assert got, "the load did not get its shards"
    assert torch.equal(loaded(got), whole()[:17])
