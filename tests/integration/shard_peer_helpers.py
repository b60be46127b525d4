"""A guarded shard server and a client's put and get, for the tests that attack it."""

from __future__ import annotations

import pytest

from rtrain.agent.snapshots.checksums import checksums
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.admission import Admission
from rtrain.core.snapshots.restore_plan import ShardId

SECRET = b"a job secret nobody else has!!!!"


def put(
    port: int,
    source: str,
    which: ShardId,
    buffer: bytearray,
    secret: bytes = SECRET,
    host: str = "127.0.0.1",
) -> None:
    client = ShardClient(host, port, secret, source)
    try:
        client.put(which, buffer, len(buffer), checksums(buffer, len(buffer)))
    finally:
        client.close()


def get(port: int, source: str, which: ShardId) -> bytearray:
    got: list[bytearray] = []
    client = ShardClient("127.0.0.1", port, SECRET, source)
    try:
        client.get(which, lambda size: got.append(bytearray(size)) or got[-1])
    finally:
        client.close()
    return got[0]


@pytest.fixture
def guarded(tmp_path):
    """A shard server of generation 3 whose replicas come from 127.0.0.2 and whose
    members are 127.0.0.1-2; its own workers reached step 10, snapshotting every step."""
    admission = Admission(3, frozenset({"127.0.0.2"}), frozenset({"127.0.0.1", "127.0.0.2"}))
    admission.ceiling.observe(9)
    admission.ceiling.observe(10)
    store = ShardStore(str(tmp_path / "shards"), budget=0)
    server = ShardServer("127.0.0.1", SECRET, store, admission)
    yield store, server
    server.close()
