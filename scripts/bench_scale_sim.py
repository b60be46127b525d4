"""bench_scale.py sim: many agents per process, the real protocol code, a real store.

A job of N simulated agents runs as processes of up to AGENTS_PER_SHARD agents each
(sim_shard.py, which says what an agent does), against one store server (TCPStore)
or a 3-member etcd cluster started here; this process drives the shards through the
run (start generation 0, count requests over a window, silence one agent, wait for
generation 1) and measures the store server's CPU. One process of 1,024 agents spent
its two cores in the kernel (3,000 threads contending for one interpreter lock), not
in the protocol: shards keep each interpreter's threads to what a node's agent has,
times AGENTS_PER_SHARD.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from etcd_cluster import EtcdCluster

SHARD = Path(__file__).resolve().parent / "sim_shard.py"
AGENTS_PER_SHARD = int(os.environ.get("BENCH_SCALE_SHARD", "512"))
WINDOW_S = float(os.environ.get("BENCH_SCALE_WINDOW_S", "10"))
ETCD_MAX_AGENTS = int(os.environ.get("BENCH_SCALE_ETCD_MAX", "1024"))


def store_server(port: int) -> subprocess.Popen[bytes]:
    code = (
        "import datetime, time, torch.distributed as d; "
        f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False, "
        "timeout=datetime.timedelta(seconds=600)); time.sleep(10**6)"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def wait_listening(port: int, timeout: float) -> None:
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"no TCPStore on port {port} after {timeout:g}s")


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


class Shard:
    """One sim_shard.py process: commands in, one JSON line back for each."""

    def __init__(
        self,
        backend: str,
        nodes: int,
        endpoint: str,
        run_id: str,
        first: int,
        end: int,
        spares: bool = False,
    ) -> None:
        command = [
            sys.executable,
            str(SHARD),
            backend,
            str(nodes),
            endpoint,
            run_id,
            str(first),
            str(end),
            *(["spares"] if spares else []),
        ]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the shard ended

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return {"error": f"no answer within {timeout:g} s"}
        if not line:
            return {"error": f"the shard exited ({self.proc.poll()})"}
        answer: dict[str, Any] = json.loads(line)
        return answer


def ask(shards: list[Shard], command: str | None, timeout: float) -> list[dict[str, Any]]:
    """Send command to every shard (None: nothing), then each one's answer."""
    if command is not None:
        for shard in shards:
            shard.send(command)
    return [shard.answer(timeout) for shard in shards]


def _first_error(answers: list[dict[str, Any]]) -> str | None:
    return next((str(a["error"]) for a in answers if a.get("error")), None)


def run_sim(
    backend: str, nodes: int, endpoint: str, servers: list[psutil.Process], spares: int = 0
) -> dict[str, object]:
    """One job of `nodes` agents, AGENTS_PER_SHARD to a process, and `spares` hot spares
    beyond them (max_nodes) in a process of their own."""
    run_id = f"sim-{os.getpid()}-{time.monotonic_ns()}"
    bounds = [*range(0, nodes, AGENTS_PER_SHARD), nodes]
    opened_at = time.monotonic()
    shards = [
        Shard(backend, nodes, endpoint, run_id, lo, hi) for lo, hi in itertools.pairwise(bounds)
    ]
    extra = [Shard(backend, nodes, endpoint, run_id, nodes, nodes + spares, True)] if spares else []
    result: dict[str, object] = {"backend": backend, "nodes": nodes, "processes": len(shards)}
    if spares:
        result["spares"] = spares
    try:
        return _measure(shards, nodes, servers, result, opened_at, extra)
    finally:
        for shard in shards + extra:
            with contextlib.suppress(OSError):
                shard.send("exit")
        for shard in shards:
            try:
                shard.proc.wait(30)
            except subprocess.TimeoutExpired:
                shard.proc.kill()


def _measure(
    shards: list[Shard],
    nodes: int,
    servers: list[psutil.Process],
    result: dict[str, object],
    opened_at: float,
    spare_shards: list[Shard],
) -> dict[str, object]:
    ready = ask(shards + spare_shards, None, 600)
    if (error := _first_error(ready)) is not None:
        result["error"] = f"connecting: {error}"
        return result
    _progress(f"  {nodes} agents connected in {time.monotonic() - opened_at:.0f} s")
    result["threads_per_process"] = max(int(a.get("threads", 0)) for a in ready)
    result["load_before"] = round(os.getloadavg()[0], 2)
    sims = [psutil.Process(shard.proc.pid) for shard in shards]
    start = time.time()
    joined = ask(shards, "go", 330)
    error = _first_error(joined)
    if error is not None or any(a.get("joined_at") is None for a in joined):
        result["error"] = error or "generation 0 did not close in 300 s"
        return result
    result["generation0_s"] = round(max(a["joined_at"] for a in joined) - start, 3)
    ask(spare_shards, "go", 60)  # the spares join the next round and wait there
    time.sleep(2.0)  # leases taken, watches open
    counts, cpu_before, t0 = ask(shards, "count", 30), cpu_of(servers), time.monotonic()
    spare_counts, sim_before = ask(spare_shards, "count", 30), cpu_of(sims)
    time.sleep(WINDOW_S)
    counts_after = ask(shards, "count", 30)
    elapsed = time.monotonic() - t0
    spare_after = ask(spare_shards, "count", 30)
    _spare_rates(result, spare_counts, spare_after, elapsed)
    result["simulator_cpu_pct"] = round((cpu_of(sims) - sim_before) / elapsed * 100, 1)
    result["loop_late_window"] = _worst(counts_after, "loop_late")
    result["task_time_window"] = _worst(counts_after, "task_time")
    moved = sum(a["bytes_out"] + a["bytes_in"] for a in counts_after) - sum(
        a["bytes_out"] + a["bytes_in"] for a in counts
    )
    result["bytes_per_agent_s"] = round(moved / elapsed / nodes, 1)
    if any("watch_starts" in a for a in counts_after):
        started = sum(int(a.get("watch_starts", 0)) for a in counts_after) - sum(
            int(a.get("watch_starts", 0)) for a in counts
        )
        result["watch_starts_per_agent_s"] = round(started / elapsed / nodes, 3)
    total = sum(a["count"] for a in counts_after) - sum(a["count"] for a in counts)
    by_op: collections.Counter[str] = collections.Counter()
    for after, before in zip(counts_after, counts, strict=True):
        by_op.update(collections.Counter(after["by_op"]) - collections.Counter(before["by_op"]))
    result["requests_per_agent_s"] = round(total / elapsed / nodes, 2)
    result["requests_per_agent_s_by_op"] = {
        op: round(n / elapsed / nodes, 2) for op, n in by_op.items()
    }
    result["store_server_cpu_pct"] = round((cpu_of(servers) - cpu_before) / elapsed * 100, 1)
    server_pct = float(result["store_server_cpu_pct"])  # type: ignore[arg-type]
    result["store_server_cpu_pct_per_agent"] = round(server_pct / nodes, 4)
    stopped, cpu_before, sim_before = time.time(), cpu_of(servers), cpu_of(sims)
    before_kill, spare_before = ask(shards, "count", 30), ask(spare_shards, "count", 30)
    ask(shards[-1:], "kill", 30)
    finished = ask(shards, "finish", 150)
    spare_finished = ask(spare_shards, "finish", 150)
    result["store_server_cpu_s_through_commit"] = round(cpu_of(servers) - cpu_before, 2)
    result["simulator_cpu_s_through_commit"] = round(cpu_of(sims) - sim_before, 2)
    result["load_after"] = round(os.getloadavg()[0], 2)
    if all("bytes_out" in a for a in finished):
        # the loss, the declaration and the whole next round, with the renewals and
        # checks of the 5 s the loss took to find (subtracted below at the window's rate)
        moved = sum(a["bytes_out"] + a["bytes_in"] for a in finished) - sum(
            a["bytes_out"] + a["bytes_in"] for a in before_kill
        )
        steady = float(result["bytes_per_agent_s"]) * nodes * (time.time() - stopped)  # type: ignore[arg-type]
        result["bytes_per_generation"] = int(max(0.0, moved - steady))
        result["bytes_through_commit"] = moved
        result["loop_late_commit"] = _worst(finished, "loop_late")
        result["join_slot_wait_commit"] = _worst(finished, "join_slot_wait")
        result["declared_by"] = sum(int(a.get("declared_by", 0)) for a in finished)
        sizes = {n for a in finished for n in a.get("next_sizes", [])}
        result["next_generation_sizes"] = sorted(sizes)
        if any("watch_starts" in a for a in finished):
            result["watch_starts_through_commit"] = sum(
                int(a.get("watch_starts", 0)) for a in finished
            ) - sum(int(a.get("watch_starts", 0)) for a in before_kill)
            reasons: collections.Counter[str] = collections.Counter()
            for answer in finished:
                reasons.update(answer.get("watch_restarts", {}))
            result["watch_restarts_total"] = dict(reasons)
    declared = [a["declared_at"] for a in finished if a.get("declared_at") is not None]
    error = _first_error(finished)
    if error is not None or not declared or any(a.get("committed_at") is None for a in finished):
        result["error"] = error or "generation 1 did not close in 120 s"
        return result
    result["detect_s"] = round(min(declared) - stopped, 3)
    # when the last survivor had noticed (the news) and rejoined: the rest is the round
    left = [a["left_at"] for a in finished if a.get("left_at") is not None]
    result["last_left_after_declared_s"] = round(max(left) - min(declared), 3)
    result["commit_after_declared_s"] = round(
        max(a["committed_at"] for a in finished) - min(declared), 3
    )
    if spare_shards:
        spared = spare_finished[0]
        spares = int(result["spares"])  # type: ignore[call-overload]
        through = spared.get("count", 0) - spare_before[0].get("count", 0)
        result["spare_requests_per_spare_through_commit"] = round(through / spares, 1)
        if spared.get("committed_at") is not None:
            result["spare_admitted_after_declared_s"] = round(
                spared["committed_at"] - min(declared), 3
            )
        else:
            result["error"] = spared.get("error") or "no spare was let in"
    return result


def _spare_rates(
    result: dict[str, object],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    elapsed: float,
) -> None:
    """The spares' store requests per spare per second over the window, by operation."""
    if not after:
        return
    spares = int(result["spares"])  # type: ignore[call-overload]
    total = sum(a["count"] for a in after) - sum(b["count"] for b in before)
    by_op: collections.Counter[str] = collections.Counter()
    for a, b in zip(after, before, strict=True):
        by_op.update(collections.Counter(a["by_op"]) - collections.Counter(b["by_op"]))
    result["spare_requests_per_spare_s"] = round(total / elapsed / spares, 2)
    result["spare_requests_per_spare_s_by_op"] = {
        op: round(n / elapsed / spares, 2) for op, n in by_op.items()
    }


def _worst(answers: list[dict[str, Any]], name: str) -> dict[str, object]:
    """The worst shard's lateness figures (each shard's own median, 99th, max)."""
    figures = [a[name] for a in answers if isinstance(a.get(name), dict) and a[name].get("n")]
    if not figures:
        return {}
    return {k: max(f[k] for f in figures) for k in ("p50_ms", "p99_ms", "max_ms")}


def _progress(message: str) -> None:
    print(f"[bench_scale sim] {message}", file=sys.stderr, flush=True)


def simulate(
    nodes_list: list[int], backends: list[str], spares: int = 0
) -> list[dict[str, object]]:
    """Every size in processes of its own (run_sim), against servers started here: no
    thread or connection of one size lingers into the next."""
    # No DNS answers on this machine, and TCPStore looks up the name of every
    # connection's peer for a log line: each lookup waited out glibc's 5 s timeout and,
    # in the server, held every other client's requests for as long (measured: one
    # connect in 25 stalled 5 s). One second, one try, for the server and the agents.
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    results: list[dict[str, object]] = []
    for backend in backends:
        server: subprocess.Popen[bytes] | None = None
        cluster: EtcdCluster | None = None
        if backend == "etcd":
            cluster = EtcdCluster(
                tempfile.mkdtemp(prefix="sim-etcd-"), 3, 20000 + os.getpid() % 20000
            )
            cluster.start()
            endpoint = cluster.endpoints
            pids = [cluster.pid(m) for m in cluster.members]
        else:
            port = 29000 + os.getpid() % 1000
            server = store_server(port)
            wait_listening(port, 300.0)  # torch imports first
            endpoint = f"127.0.0.1:{port}"
            pids = [server.pid]
        servers = [psutil.Process(pid) for pid in pids]
        try:
            for nodes in nodes_list:
                if backend == "etcd" and nodes > ETCD_MAX_AGENTS:
                    results.append({"backend": backend, "nodes": nodes, "error": (
                        f"not run: over {ETCD_MAX_AGENTS} agents (each holds 6 threads and "
                        "connections)")})  # fmt: skip
                    continue
                _progress(f"{backend} with {nodes} agents")
                result = run_sim(backend, nodes, endpoint, servers, spares)
                _progress(f"  {result}")
                results.append(result)
        finally:
            if server is not None:
                server.kill()
            if cluster is not None:
                cluster.stop()
    return results
