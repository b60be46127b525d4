"""Benchmark in-memory snapshots against the machine's limits and against disk checkpoints.

For each state size (a state dict of float32 tensors):
  snapshot     rtrain.core.snapshot() on the step's path   vs a plain memory copy
  replicate    ShardClient.put to a ShardServer (loopback)  vs one loopback TCP stream
               and its CPU: seconds of CPU per GB for the checksums (the sender's
               agent), and for a put (the sender's send, the receiver's receive and
               verification: both ends, in this one process)
  restore      local memory: the agent verifies the held copy, the worker's
               restore(copy=False) maps it (also shown: restore() with a copy)
                                                            vs torch.load of the same file
                                                            (evicted from the page cache)
  peer restore ShardClient.get from a peer into a fresh slot, as the agent does,
               + restore(copy=False)                        vs one loopback TCP stream
--peer-only: the peer restore alone, as the agent does it after a failure (into a
spare slot written before it, agent/snapshots/spare_pool.py; and into fresh memory),
interleaved with the loopback stream over --reps repetitions, medians, the load beside.
And, for one size, a job's end-to-end recovery (fault -> first step done with the state
restored): rtrain restoring from memory within the job, vs torchrun restarting
(in-job, and as a fresh launch after the crash, as a requeue would) from a torch.save
checkpoint written every step.

Each micro figure is the best of --reps repetitions (the machine's steady state).
Results go to docs/benchmarks.md.

    python scripts/bench_snapshot.py --sizes 10,100,1000 --e2e-mb 500
"""

from __future__ import annotations

import argparse
import mmap
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import end_to_end
from bench_launch import write_doc

from rtrain.agent.snapshots.checksums import checksums, verify
from rtrain.agent.snapshots.peers.client import ShardClient
from rtrain.agent.snapshots.peers.server import ShardServer
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.format import (
    plan_shard,
    read_shard,
    set_replicated,
    write_shard,
)
from rtrain.core.snapshots.restore_plan import ShardId

ROOT = Path(__file__).resolve().parents[1]
MARK_BEGIN, MARK_END = "<!-- bench_snapshot:begin -->", "<!-- bench_snapshot:end -->"
SECRET = os.urandom(32)
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _state(mb: int) -> dict:
    """A model-like state: a few large tensors and some small ones."""
    total = mb * 2**20 // 4
    big = total // 4
    state = {f"layer{i}.weight": torch.randn(big) for i in range(3)}
    state["optimizer"] = {"exp_avg": torch.randn(total - 3 * big - 1024), "step": 7}
    state["small"] = torch.randn(1024)
    return state


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_seconds(nbytes: int, reps: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    return _best(lambda: dst.copy_(src), reps)


def loopback_seconds(nbytes: int, reps: int) -> float:
    """One TCP stream over loopback, sender and receiver in this process."""
    payload = memoryview(bytearray(nbytes))
    sink = bytearray(1 << 20)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def receive() -> None:
        conn, _ = listener.accept()
        with conn:
            while conn.recv_into(sink):
                pass

    times = []
    for _ in range(reps):
        thread = threading.Thread(target=receive)
        thread.start()
        start = time.perf_counter()
        with socket.create_connection(listener.getsockname()) as out:
            out.sendall(payload)
        thread.join()
        times.append(time.perf_counter() - start)
    listener.close()
    return min(times)


def snapshot_seconds(state: dict, reps: int) -> float:
    """rtrain.core.snapshot() in steady state (slots allocated), replication acked at once."""
    import rtrain.core.worker.snapshots as api

    with tempfile.TemporaryDirectory(dir=SHM) as folder:
        os.environ[api.SNAPSHOT_DIR], os.environ["RANK"] = folder, "0"
        api._slots = None
        times = []
        try:
            for step in range(reps + 2):
                start = time.perf_counter()
                api.snapshot(state, step)
                times.append(time.perf_counter() - start)
                slots = api._my_slots()
                assert slots is not None
                newest = slots.newest()
                assert newest is not None and newest.map is not None
                set_replicated(newest.map, step)  # the agent's part, off the step's path
        finally:
            del os.environ[api.SNAPSHOT_DIR]
            api._slots = None
    return min(times[2:])


def shard_figures(state: dict, reps: int) -> dict[str, float]:
    layout = plan_shard(state)
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 1)
    size = layout.size
    crcs = checksums(buffer, size)
    hash_cpu = _cpu(lambda: checksums(buffer, size), reps)
    shard = ShardId(0, 0, 1)
    with tempfile.TemporaryDirectory(dir=SHM) as folder:
        store = ShardStore(folder, budget=0)
        server = ShardServer("127.0.0.1", SECRET, store)
        client = ShardClient("127.0.0.1", server.port, SECRET)
        try:
            replicate = _best(lambda: client.put(shard, buffer, size, crcs), reps)
            put_cpu = _cpu(lambda: client.put(shard, buffer, size, crcs), reps)
            held = store.open_shard(shard)
            assert held is not None
            local_buffer = held[0]
            local_path = store.replicas()[0][1]

            def restore_local(copy: bool) -> None:
                # The agent verifies the copy and hard-links it into the new worker's
                # slot (no copy); the worker's restore() maps it, or copies it.
                assert verify(local_buffer, size, crcs)
                _worker_restore(local_path, copy)

            def restore_peer() -> None:
                target = store.restore_target(1, 0, size)  # a fresh slot, as the agent
                client.get(shard, lambda n: target)
                target.close()
                _worker_restore(os.path.join(store.snap_dir(1), "rank0.slot0"), copy=False)

            local = _best(lambda: restore_local(copy=False), reps)
            local_copy = _best(lambda: restore_local(copy=True), reps)
            # A fresh connection: the server closes one idle for IO_TIMEOUT_S, which
            # the local restores of 1 GB can outlast on a loaded machine.
            client.close()
            client = ShardClient("127.0.0.1", server.port, SECRET)
            peer = _best(restore_peer, reps)
        finally:
            client.close()
            server.close()
    with tempfile.TemporaryDirectory(dir=ROOT) as folder:  # a disk, not tmpfs
        path = os.path.join(folder, "state.pt")
        torch.save(state, path)

        def load_from_disk() -> None:
            # Evict the file from the page cache first, so torch.load reads the disk,
            # as after a restart on a replacement node.
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            torch.load(path)

        load = _best(load_from_disk, reps)
    return {
        "replicate": replicate,
        "local": local,
        "local_copy": local_copy,
        "peer": peer,
        "load": load,
        "bytes": size,
        "hash_cpu": hash_cpu,
        "put_cpu": put_cpu,
    }


def _cpu(fn, reps: int) -> float:
    """CPU seconds of this process (every thread) per call of fn, the mean of reps."""
    began = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - began) / reps


def _worker_restore(path: str, copy: bool) -> None:
    """What restore() does with the slot the agent prepared."""
    with open(path, "rb") as handle:
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    read_shard(buffer, copy=copy)


def measure(sizes: list[int], reps: int) -> list[dict]:
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("snapshot sizes", total=len(sizes))
        for mb in sizes:
            state = _state(mb)
            nbytes = mb * 2**20
            row = {"mb": mb, "memcpy": memcpy_seconds(nbytes, reps)}
            row["loopback"] = loopback_seconds(nbytes, reps)
            row["snapshot"] = snapshot_seconds(state, reps)
            row.update(shard_figures(state, reps))
            rows.append(row)
            del state
            progress.advance(task)
    return rows


def _gbs(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def render(rows: list[dict], e2e: dict | None, command: str) -> str:
    lines = [
        MARK_BEGIN,
        "## In-memory snapshots (`scripts/bench_snapshot.py`)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}; "
        f"best of the repetitions, {time.strftime('%Y-%m-%d')}. Limits measured in the same "
        "run: a plain memory copy and one loopback TCP stream of the same bytes.",
        "",
        "| state | snapshot on the step's path | memory copy | ratio (target <= 1.2) "
        "| replicate to a peer | loopback limit | vs limit (target >= 0.5) "
        "| restore, local memory | torch.load | speed-up (target >= 10x) "
        "| local restore with a copy | restore, peer memory | vs limit (target >= 0.5) "
        "| CPU-s per GB: checksums | CPU-s per GB: a put, both ends |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = r["bytes"]
        lines.append(
            f"| {r['mb']} MB | {r['snapshot'] * 1e3:.1f} ms | {r['memcpy'] * 1e3:.1f} ms "
            f"({_gbs(n, r['memcpy'])}) | {r['snapshot'] / r['memcpy']:.2f} "
            f"| {_gbs(n, r['replicate'])} | {_gbs(n, r['loopback'])} "
            f"| {r['loopback'] / r['replicate']:.2f} "
            f"| {r['local'] * 1e3:.1f} ms ({_gbs(n, r['local'])}) "
            f"| {r['load'] * 1e3:.1f} ms ({_gbs(n, r['load'])}) | {r['load'] / r['local']:.1f}x "
            f"| {r['local_copy'] * 1e3:.1f} ms ({r['load'] / r['local_copy']:.1f}x) "
            f"| {_gbs(n, r['peer'])} | {r['loopback'] / r['peer']:.2f} "
            f"| {r['hash_cpu'] / (n / 1e9):.3f} | {r['put_cpu'] / (n / 1e9):.3f} |"
        )
    if e2e:
        lines += ["", *e2e["lines"]]
    lines.append(MARK_END)
    return "\n".join(lines)


def peer_restore_medians(mb: int, reps: int) -> dict[str, float]:
    """Median seconds of one loopback stream and of a restore from a peer into a spare
    slot and into fresh memory, the three taken in turn in each repetition (a loaded
    machine's drift falls on all three alike)."""
    state = _state(mb)
    layout = plan_shard(state)
    buffer = bytearray(layout.size)
    write_shard(buffer, layout, 1)
    del state
    size, shard = layout.size, ShardId(0, 0, 1)
    times: dict[str, list[float]] = {"loopback": [], "spare": [], "fresh": []}
    with tempfile.TemporaryDirectory(dir=SHM) as folder:
        peer = ShardServer("127.0.0.1", SECRET, ShardStore(os.path.join(folder, "peer"), 0))
        node = ShardStore(os.path.join(folder, "node"), 0)
        client = ShardClient("127.0.0.1", peer.port, SECRET)
        try:
            client.put(shard, buffer, size, checksums(buffer, size))
            del buffer

            def restore() -> None:
                target = node.restore_target(1, 0, size)
                client.get(shard, lambda n: target)
                target.close()
                _worker_restore(os.path.join(node.snap_dir(1), "rank0.slot0"), copy=False)

            for _ in range(reps):
                times["loopback"].append(loopback_seconds(size, 1))
                node.pool.top_up(1, size, 2 * size)  # as the service keeps one per rank
                times["spare"].append(_best(restore, 1))
                node.pool.close()
                node.pool.wanted = False  # fresh memory on purpose: no warning
                times["fresh"].append(_best(restore, 1))
        finally:
            client.close()
            peer.close()
            node.pool.close()
    return {key: statistics.median(values) for key, values in times.items()} | {"bytes": size}


def print_peer_restores(sizes: list[int], reps: int) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    print(
        "| state | loopback stream | restore into a spare slot | vs loopback (target >= 0.7) "
        "| into fresh memory | vs loopback |"
    )
    print("|---|---|---|---|---|---|")
    for mb in sizes:
        m = peer_restore_medians(mb, reps)
        print(
            f"| {mb} MB | {_gbs(m['bytes'], m['loopback'])} | {_gbs(m['bytes'], m['spare'])} "
            f"| {m['loopback'] / m['spare']:.2f} | {_gbs(m['bytes'], m['fresh'])} "
            f"| {m['loopback'] / m['fresh']:.2f} |"
        )
    print(f"load average {os.getloadavg()[0]:.1f} after; medians of {reps} repetitions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000", help="state sizes in MB")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--e2e-mb", type=int, default=500, help="0 to skip the job runs")
    parser.add_argument("--e2e-runs", type=int, default=2)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--peer-only", action="store_true", help="the peer restore alone")
    args = parser.parse_args()
    if args.peer_only:
        print_peer_restores([int(s) for s in args.sizes.split(",")], args.reps)
        return
    rows = measure([int(s) for s in args.sizes.split(",")], args.reps)
    table = Table(title="in-memory snapshots (best of repetitions)")
    columns = (
        "state",
        "snapshot",
        "memcpy",
        "snapshot / memcpy",
        "replicate / loopback",
        "CPU-s/GB checksums",
        "CPU-s/GB put (both ends)",
        "local restore vs load",
    )
    for column in columns:
        table.add_column(column)
    for r in rows:
        gb = r["bytes"] / 1e9
        table.add_row(
            f"{r['mb']} MB",
            f"{r['snapshot'] * 1e3:.1f} ms",
            f"{r['memcpy'] * 1e3:.1f} ms",
            f"{r['snapshot'] / r['memcpy']:.2f}",
            f"{r['loopback'] / r['replicate']:.2f}",
            f"{r['hash_cpu'] / gb:.3f}",
            f"{r['put_cpu'] / gb:.3f}",
            f"{r['load'] / r['local']:.1f}x",
        )
    Console().print(table)
    e2e = end_to_end(args.e2e_mb, args.e2e_runs) if args.e2e_mb else None
    if e2e:
        Console().print("\n".join(e2e["lines"]))
    command = (
        f"python scripts/bench_snapshot.py --sizes {args.sizes} --reps {args.reps} "
        f"--e2e-mb {args.e2e_mb} --e2e-runs {args.e2e_runs}"
    )
    write_doc(render(rows, e2e, command), Path(args.doc), MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
