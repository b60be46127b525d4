"""What a reachable store or a stolen secret gives an attacker: real servers, real
sockets from other loopback addresses, and a live job attacked while it trains."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import socket
import stat
from pathlib import Path

import pytest
import torch

from rtrain.agent.snapshots.peers.wire import ShardError
from rtrain.agent.store.opening import host_store
from rtrain.core.rendezvous.protocol import StoreKeys, decode_master
from rtrain.core.snapshots.format import (
    COMMITTED,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    VERSION,
    plan_shard,
    write_shard,
)
from rtrain.core.snapshots.restore_plan import ShardId
from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.helpers import PROBE, RTRAIN, probe_env, run
from tests.integration.shard_peer_helpers import SECRET, get, put

FAST = ["--nproc-per-node=2", "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def shard(value: float, step: int) -> bytearray:
    layout = plan_shard({"w": torch.full((100,), value), "step": step})
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, step)
    return buffer


def pickled_shard(marker: Path, step: int) -> bytearray:
    """A forged shard whose skeleton is a pickle that runs `touch marker` when loaded."""

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    meta = pickle.dumps({"model": Payload()})
    buffer = bytearray(HEADER_SIZE + len(meta))
    HEADER.pack_into(buffer, 0, MAGIC, VERSION, COMMITTED, step, len(meta), 0, -1)
    buffer[HEADER_SIZE:] = meta
    return buffer


def test_a_replica_is_accepted_only_from_its_sender_for_now_and_a_plausible_step(guarded):
    store, server = guarded
    put(server.port, "127.0.0.2", ShardId(3, 1, 9), shard(1.0, 9))
    put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(1.0, 10))  # its sender went past 9
    # a member's secret, used from elsewhere: no handshake at all
    with pytest.raises(ShardError, match="not a member"):
        put(server.port, "127.0.0.3", ShardId(3, 1, 11), shard(1.0, 11))
    # a member, but not this node's sender
    with pytest.raises(ShardError, match="does not replicate to this node"):
        put(server.port, "127.0.0.1", ShardId(3, 1, 11), shard(1.0, 11))
    with pytest.raises(ShardError, match="not the current one"):
        put(server.port, "127.0.0.2", ShardId(2, 1, 11), shard(1.0, 11))
    with pytest.raises(ShardError, match="beyond any step this job has reached"):
        put(server.port, "127.0.0.2", ShardId(3, 1, 10**9), shard(1.0, 10**9))
    with pytest.raises(ShardError, match="older than the replica kept"):
        put(server.port, "127.0.0.2", ShardId(3, 1, 4), shard(1.0, 4))
    assert sorted(s.step for s, _ in store.replicas()) == [9, 10]
    assert (server.refusals["put"], server.refusals["stranger"]) == (4, 1)


def test_a_shard_goes_to_members_only(guarded):
    _, server = guarded
    put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(2.0, 10))
    assert get(server.port, "127.0.0.1", ShardId(3, 1, 10)) == shard(2.0, 10)
    with pytest.raises(ShardError, match="not a member"):  # refused before the handshake
        get(server.port, "127.0.0.9", ShardId(3, 1, 10))


def test_stores_listen_on_the_job_address_only():
    opened = host_store("127.0.0.2", 0, 5.0)
    with socket.create_connection(("127.0.0.2", opened.port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", opened.port), timeout=5)


def test_a_live_job_gives_a_thief_of_its_secret_nothing_and_takes_no_plant(tmp_path):
    """The secret leaked (RTRAIN_SECRET): from another address the thief can neither
    read state nor plant a replica; from a member's own address, a planted far-future
    replica with a pickled skeleton is refused; a restart then restores real state."""
    from torch.distributed import TCPStore

    marker = tmp_path / "planted-code-ran"
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        [*FAST, "--max-restarts=1"],
        script=SNAPSHOTTING,
        PROBE_STEPS="40",
        PROBE_STEP_SLEEP="0.1",
        PROBE_FAULT="rank=0,step=20,gen=0,action=exit",
        RTRAIN_SECRET=SECRET.decode(),
    )
    try:
        cluster.wait_progress(5)
        store = TCPStore(
            "127.0.0.1", cluster.port, is_master=False, timeout=datetime.timedelta(seconds=10)
        )
        keys = StoreKeys("recovery")
        assert not store.check([keys.secret])  # given to the agents, never put in the store
        _, port0 = decode_master(store.get(keys.shards(0, 0)))
        with pytest.raises(ShardError, match="not a member"):
            get(port0, "127.0.0.9", ShardId(0, 2, 3))
        for source in ("127.0.0.9", "127.0.0.2"):  # node 1 replicates to node 0
            with pytest.raises(ShardError, match="refused"):
                put(port0, source, ShardId(0, 2, 10**6), pickled_shard(marker, 10**6))
        codes = cluster.wait()
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert codes == [0, 0], logs
    assert not marker.exists()
    steps = {json.loads(p.read_text())["step"] for p in cluster.out.glob("restored_*.json")}
    assert len(steps) == 1 and steps.pop() < 20


def test_without_a_secret_the_first_line_says_it_goes_through_the_store(tmp_path):
    """Where the store listens beyond loopback: a host name is listened on everywhere."""
    env = probe_env(tmp_path / "out", PROBE_STEPS="1")
    env.pop("RTRAIN_SECRET", None)
    store = ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]  # a port it binds itself
    result = run([*RTRAIN, *store, "--nproc-per-node=1", PROBE], env)
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert "no job secret given" in first and "rendezvous store" in first


def test_a_store_on_loopback_alone_gets_no_secret_warning(tmp_path):
    """Issue 31: --standalone warned that anyone who can reach its store can read the
    job's snapshots, though its store listens on 127.0.0.1 alone."""
    env = probe_env(tmp_path / "out", PROBE_STEPS="1")
    env.pop("RTRAIN_SECRET", None)
    result = run([*RTRAIN, "--standalone", "--nproc-per-node=1", PROBE], env)
    assert result.returncode == 0, result.stderr
    assert "no job secret given" not in result.stderr
    assert "hosting the rendezvous store on 127.0.0.1:" in result.stderr


@pytest.mark.parametrize(
    ("mode", "content", "fragment"),
    [
        (0o644, b"s3cret", "readable by others (mode 0644"),
        (0o600, b"  \n", "must hold 1 to 4096 bytes"),
    ],
)
def test_a_secret_file_others_can_read_is_refused(tmp_path, mode, content, fragment):
    path = tmp_path / "secret"
    path.write_bytes(content)
    path.chmod(mode)
    env = probe_env(tmp_path / "out")
    env.pop("RTRAIN_SECRET", None)
    result = run([*RTRAIN, "--standalone", f"--secret-file={path}", "--dry-run", PROBE], env)
    assert result.returncode == 64, result.stderr
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_secret_file_is_used_and_not_the_store(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    env = probe_env(tmp_path / "out", PROBE_STEPS="1")
    env.pop("RTRAIN_SECRET", None)
    result = run([*RTRAIN, "--standalone", f"--secret-file={path}", PROBE], env)
    assert result.returncode == 0, result.stderr
    assert "no job secret given" not in result.stderr


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.5)
    try:
        while sock.recv(4096):  # the hello of a connection that got a handshake
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def test_a_slow_flood_of_unauthenticated_connections_is_bounded(guarded, caplog):
    """Hundreds of clients that send a byte now and then: at most MAX_UNAUTHENTICATED
    get a thread, each is cut off HANDSHAKE_S after it connected, the flood is logged
    once, and a real peer still gets in meanwhile."""
    import threading
    import time

    from rtrain.agent.snapshots.peers import server as shard_server

    store, server = guarded
    before = threading.active_count()
    socks = []
    for _ in range(200):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.send(b"x")
        socks.append(sock)
    time.sleep(0.5)
    assert threading.active_count() - before <= shard_server.MAX_UNAUTHENTICATED + 2
    for _ in range(3):  # a byte every so often keeps no connection open past the deadline
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"x")
        time.sleep(shard_server.HANDSHAKE_S / 2)
    time.sleep(1.0)
    put(server.port, "127.0.0.2", ShardId(3, 1, 10), shard(1.0, 10))  # served again
    assert all(closed_by_peer(sock) for sock in socks)
    assert server.refusals["flood"] >= 200 - shard_server.MAX_UNAUTHENTICATED
    floods = [r for r in caplog.records if "already authenticating" in r.getMessage()]
    assert len(floods) == 1
    assert store.replicas()
