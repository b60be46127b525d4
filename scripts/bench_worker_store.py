"""The workers' store: torch's classic TCPStore server against its libuv server.

What a generation's workers ask of MASTER_ADDR:MASTER_PORT at init_process_group, for
N workers: each connects, sets its own key and waits for and reads others' (gloo
publishes a rank's address and reads its peers'). The clients are rtrain's wire client
(agent/store/tcpstore_client.py) in PROCS processes, so that the figures are the
server's, not torch's client's (which names every address it connects to with a
reverse lookup: 5 s now and then on this machine). Reported per size and server: the
time until every client is connected, and the time of the set/wait/get round after a
common start; the ratio classic / libuv (docs/benchmarks.md says what it decided).

    python scripts/bench_worker_store.py [--sizes 256,1024,4096] [--procs 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

WAIT_KEYS = 8  # keys each client waits for and reads, spread over the ranks
TIMEOUT = datetime.timedelta(seconds=300)


def _clients(port: int, first: int, count: int, size: int, ready: Any, go: Any, out: Any) -> None:
    from rtrain.agent.store.tcpstore_client import TCPStoreClient

    connected = [TCPStoreClient.connect("127.0.0.1", port, 120) for _ in range(count)]
    ready.put(time.monotonic())
    go.wait()
    start = time.monotonic()
    keys = [f"rank_{r}" for r in range(0, size, max(1, size // WAIT_KEYS))]
    for offset, client in enumerate(connected):
        client.set(f"rank_{first + offset}", b"x" * 64)
    for client in connected:
        client.wait(keys, TIMEOUT)
        client.multi_get(keys)
    out.put(time.monotonic() - start)
    for client in connected:
        client.close()


def _one(libuv: bool, size: int, procs: int) -> tuple[float, float]:
    import torch.distributed as dist

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]
    server = dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=TIMEOUT,
        use_libuv=libuv,
        master_listen_fd=listener.detach(),
    )
    assert server.libuvBackend is libuv
    ready, out, go = mp.Queue(), mp.Queue(), mp.Event()
    share = size // procs
    workers = [
        mp.Process(target=_clients, args=(port, p * share, share, size, ready, go, out))
        for p in range(procs)
    ]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    connected = max(ready.get(timeout=300) for _ in workers) - began
    go.set()
    round_s = max(out.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(60)
    del server
    return connected, round_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    mp.set_start_method("fork")
    print("| workers | server | connect, median | set/wait/get, median | classic / libuv |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.reps):
            for libuv in (True, False):  # interleaved: the machine's load falls on both
                runs[libuv].append(_one(libuv, size, args.procs))
        medians = {
            libuv: tuple(statistics.median(r[i] for r in rows) for i in (0, 1))
            for libuv, rows in runs.items()
        }
        for libuv in (True, False):
            connect, round_s = medians[libuv]
            ratio = "" if libuv else f"{round_s / medians[True][1]:.1f}x"
            name = "libuv" if libuv else "classic"
            print(f"| {size} | {name} | {connect:.2f} s | {round_s:.2f} s | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
