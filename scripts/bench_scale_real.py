"""bench_scale.py real: N real agents on this machine (one trivial worker each,
`--no-python sh`), per backend in the same run: startup, idle CPU, the store host's
CPU, etcd's requests, a silent node loss (detected, committed), `rtrain status`."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from etcd_cluster import EtcdCluster

WINDOW_S = float(os.environ.get("BENCH_SCALE_WINDOW_S", "10"))
HEARTBEAT = ["--heartbeat-interval=1", "--heartbeat-timeout=5"]
LOG_TIME = re.compile(r"\[rtrain (\d\d:\d\d:\d\d\.\d\d\d) ")


def progress(message: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_command(out: Path) -> list[str]:
    """A worker that notes when it runs (rank, generation) and then idles."""
    script = (
        f"date +%s.%N > {out}/r${{RANK}}.g${{TORCHELASTIC_RESTART_COUNT}}.tmp && "
        f"mv {out}/r${{RANK}}.g${{TORCHELASTIC_RESTART_COUNT}}.tmp "
        f"{out}/r${{RANK}}.g${{TORCHELASTIC_RESTART_COUNT}}; exec sleep 3600"
    )
    return ["--no-python", "/bin/sh", "-c", script]


def launch(
    backend: str, nodes: int, index: int, endpoint: str, out: Path, log: Path
) -> subprocess.Popen[bytes]:
    nnodes = f"{nodes // 2}:{nodes}"
    if backend == "torchrun":
        cmd = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=scale", f"--local-addr=127.0.0.{index + 1}", "--max-restarts=3",
            "--rdzv-conf=last_call_timeout=600",
        ]  # fmt: skip
    else:
        rdzv = "etcd" if backend == "etcd" else "c10d"
        # A long last call: generation 0 waits for every agent however slow the start
        # (64 agents importing on 2 cores); the survivors of a loss close at once anyway.
        conf = "join_timeout=600,last_call_timeout=600" + (
            "" if rdzv == "etcd" else f",is_host={'true' if index == 0 else 'false'}"
        )
        cmd = [
            sys.executable, "-m", "rtrain.cli.main", "launch", f"--nnodes={nnodes}",
            "--nproc-per-node=1", f"--rdzv-backend={rdzv}", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id=scale-{out.parent.name}",
            f"--rdzv-conf={conf}", f"--local-addr=127.0.0.{index + 1}",
            "--preload=none", *HEARTBEAT,
        ]  # fmt: skip
    env = {**os.environ, "RTRAIN_SECRET": "bench-scale-secret", "OMP_NUM_THREADS": "1"}
    handle = open(log, "wb")  # noqa: SIM115 - the agent writes to it until it exits
    return subprocess.Popen(
        [*cmd, *worker_command(out)], stdout=handle, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip


def running(out: Path, generation: int) -> dict[int, float]:
    found = {}
    for path in out.glob(f"r*.g{generation}"):
        try:
            found[int(path.name[1:].split(".")[0])] = float(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def cpu_seconds(procs: list[psutil.Process]) -> list[float]:
    seconds = []
    for proc in procs:
        try:
            times = proc.cpu_times()
            seconds.append(times.user + times.system)
        except psutil.Error:
            seconds.append(0.0)
    return seconds


def start_cpu(procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """Where the startup goes: the CPU seconds each agent's process tree (the agent, its
    pool, its worker) used until every worker ran; node 0's (the store's host under
    TCPStore and torchrun) apart from the median of the others'. N agents on C cores
    take at least N x that / C to start."""
    used = []
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            used.append(sum(cpu_seconds([root, *root.children(recursive=True)])))
        except psutil.Error:
            used.append(0.0)
    others = sorted(used[1:]) or [0.0]
    return {
        "start_cpu_s_node0": round(used[0], 2),
        "start_cpu_s_agent": round(others[len(others) // 2], 2),
    }


def etcd_requests(cluster: EtcdCluster) -> float:
    """Requests and stream messages the members' gRPC servers received, all methods."""
    import urllib.request

    total = 0.0
    for member in cluster.members:
        try:
            text = urllib.request.urlopen(f"http://{member.endpoint}/metrics", timeout=5).read()
        except OSError:
            continue
        for line in text.decode().splitlines():
            if line.startswith("grpc_server_msg_received_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def log_times(log: Path, needle: str) -> list[float]:
    """Epoch times of the agent log lines containing needle."""
    times = []
    today = datetime.now().strftime("%Y-%m-%d")
    for line in log.read_text(errors="replace").splitlines():
        if needle in line:
            match = LOG_TIME.search(line)
            if match:
                stamp = datetime.strptime(f"{today} {match.group(1)}", "%Y-%m-%d %H:%M:%S.%f")
                times.append(stamp.timestamp())
    return times


def real_run(backend: str, nodes: int, etcd: EtcdCluster | None) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix=f"scale-{backend}-{nodes}-"))
    out = work / "out"
    out.mkdir()
    endpoint = etcd.endpoints if backend == "etcd" and etcd else f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = [work / f"node{i}.log" for i in range(nodes)]
    result: dict[str, object] = {"backend": backend, "nodes": nodes}
    try:
        for index in range(nodes):
            procs.append(launch(backend, nodes, index, endpoint, out, logs[index]))
        last_start = time.time()
        if not wait_for(
            lambda: len(running(out, 0)) == nodes,
            float(os.environ.get("BENCH_SCALE_START_S", "600")),
        ):
            tail = logs[0].read_text(errors="replace").strip().splitlines()[-3:]
            result["error"] = f"only {len(running(out, 0))} of {nodes} workers ran: {tail}"
            return result
        result["startup_s"] = round(max(running(out, 0).values()) - last_start, 3)
        result.update(start_cpu(procs))
        time.sleep(2.0)  # past the start's own burst
        agents = [psutil.Process(p.pid) for p in procs]
        before = cpu_seconds(agents)
        requests_before = etcd_requests(etcd) if backend == "etcd" and etcd else 0.0
        members = (
            [psutil.Process(etcd.pid(m)) for m in etcd.members]
            if backend == "etcd" and etcd
            else []
        )  # type: ignore[arg-type]
        members_before = sum(cpu_seconds(members))
        time.sleep(WINDOW_S)
        used = [(b - a) / WINDOW_S * 100 for a, b in zip(before, cpu_seconds(agents), strict=True)]
        idle = sorted(used[1:])
        result["idle_agent_cpu_pct"] = round(idle[len(idle) // 2], 2)
        if backend == "etcd" and etcd:
            result["store_host_cpu_pct"] = round(
                (sum(cpu_seconds(members)) - members_before) / WINDOW_S * 100, 2
            )
            result["store_requests_per_agent_s"] = round(
                (etcd_requests(etcd) - requests_before) / WINDOW_S / nodes, 2
            )
        else:
            result["store_host_cpu_pct"] = round(used[0], 2)  # node 0 hosts the TCPStore
        if backend != "torchrun":
            result.update(status_figures(backend, endpoint, f"scale-{work.name}"))
        # a silent node loss: the last node's agent and worker stop
        victim = nodes - 1
        stopped = [
            psutil.Process(procs[victim].pid),
            *psutil.Process(procs[victim].pid).children(recursive=True),
        ]
        t_stop = time.time()
        for proc in stopped:
            proc.send_signal(signal.SIGSTOP)
        survivors = nodes - 1
        # twice as long as the start took, at least 30 s; torchrun does not look for a
        # stopped node at all (its monitor watches only its own workers): 30 s
        limit = 30.0 if backend == "torchrun" else max(30.0, 2 * float(result["startup_s"]))  # type: ignore[arg-type]
        recovered = wait_for(lambda: len(running(out, 1)) >= survivors, limit)
        if not recovered:
            declared = [t for log in logs[:victim] for t in log_times(log, "lost: its lease")]
            result["loss"] = f"{len(running(out, 1))} of {survivors} restarted within {limit:.0f} s"
            if declared:
                result["detect_s"] = round(min(declared) - t_stop, 3)
            return result
        result["loss_to_workers_s"] = round(max(running(out, 1).values()) - t_stop, 3)
        declared = [t for log in logs[:victim] for t in log_times(log, "lost: its lease")]
        committed = [t for log in logs[:victim] for t in log_times(log, "generation 1 layout")]
        if declared and committed:
            result["detect_s"] = round(min(declared) - t_stop, 3)
            result["commit_after_declared_s"] = round(max(committed) - min(declared), 3)
        return result
    finally:
        for proc in procs:
            try:
                for child in [
                    psutil.Process(proc.pid),
                    *psutil.Process(proc.pid).children(recursive=True),
                ]:
                    child.send_signal(signal.SIGCONT)
                    child.kill()
            except psutil.Error:
                pass
            proc.wait()
        if not os.environ.get("BENCH_SCALE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def status_figures(backend: str, endpoint: str, run_id: str) -> dict[str, object]:
    """`rtrain status` against the running job: the whole command (a new process,
    torch's import included), and the reads alone from a client already connected
    (median of 5), with the number of store calls they made."""
    from rtrain.agent.observe.status_reader import read_status
    from rtrain.cli.status import open_reader_store, rdzv_spec

    rdzv = ["--rdzv-backend=etcd" if backend == "etcd" else "--rdzv-backend=c10d"]
    argv = [sys.executable, "-m", "rtrain.cli.main", "status", *rdzv, "--json"]
    started = time.monotonic()
    shown = subprocess.run(
        [*argv, f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}"],
        capture_output=True,
        text=True,
    )
    command_s = time.monotonic() - started
    if shown.returncode != 0:
        return {"status_error": shown.stderr.strip().splitlines()[-1:]}
    view = json.loads(shown.stdout)
    seen = sum(1 for n in view["nodes"] if n["problem"] is None and n["age_s"] is not None)
    store = open_reader_store(rdzv_spec(backend, endpoint, run_id, "", 10.0))
    times = []
    for _ in range(5):
        started = time.monotonic()
        read_status(store, run_id)
        times.append(time.monotonic() - started)
    return {
        "status_command_s": round(command_s, 3),
        "status_reads_s": round(sorted(times)[2], 4),
        "status_store_calls": view["store_reads"],
        "status_nodes_seen": seen,
    }


def real(args: argparse.Namespace) -> list[dict[str, object]]:
    etcd = None
    if "etcd" in args.backends:  # ports below the ephemeral range, as the tests' etcd
        etcd = EtcdCluster(tempfile.mkdtemp(prefix="scale-etcd-"), 3, 20000 + free_port() % 12000)
        etcd.start()
    results = []
    try:
        for nodes in args.nodes:
            for backend in args.backends:
                progress(f"real: {backend} with {nodes} agents")
                result = real_run(backend, nodes, etcd)
                progress(f"  {result}")
                results.append(result)
    finally:
        if etcd is not None:
            etcd.stop()
    return results
