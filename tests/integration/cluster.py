"""LocalCluster: several rtrain agents on localhost, each one a "node" with its own address.

Node i runs with --local-addr 127.0.0.<i+1>; node 0 hosts the rendezvous store (the
others get is_host=false, so which one starts first does not matter). Faults
are injected for real: a node is killed (agent, pool and workers together, like a
machine that dies) or stopped with SIGSTOP (like one that hangs or is cut off).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from rtrain.core.observe.events import Event
from tests.integration.helpers import ROOT, RTRAIN, HeldPort, events_under, probe_env

RESUMABLE = str(ROOT / "tests" / "scripts" / "train_resumable.py")
SNAPSHOTTING = str(ROOT / "tests" / "scripts" / "train_snapshot.py")
STEPS = "40"  # steps of the RESUMABLE runs that the `reference` fixture is made for


class LocalCluster:
    def __init__(
        self,
        tmp: Path,
        nodes: int,
        nnodes: str,
        flags: list[str],
        conf: str = "join_timeout=30",
        script: str = RESUMABLE,
        node_env: dict[int, dict[str, str]] | None = None,
        script_args: list[str] | None = None,
        etcd: str | None = None,
        **env: str,
    ) -> None:
        """etcd: the endpoints of an etcd cluster to meet through instead of node 0's
        TCPStore (then no node hosts anything)."""
        self.etcd = etcd
        # A run id of its own on etcd, whose keys outlive the cluster's processes.
        self.run_id = f"recovery-{os.getpid()}-{time.monotonic_ns()}" if etcd else "recovery"
        self.conf = conf
        self.script = script
        self.script_args = script_args or []
        self.tmp = tmp
        self.out = tmp / "out"
        # Node 0's store port, held until close(): node 0 (and a replacement) binds it,
        # the others are told it before it listens (see HeldPort).
        self._held = HeldPort() if etcd is None else None
        self.port = self._held.port if self._held is not None else 0
        self.env = probe_env(self.out, PROBE_CKPT=str(tmp / "ckpt.pt"), **env)
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[Path] = []
        for index in range(nodes):
            self.start_node(index, nnodes, flags, (node_env or {}).get(index))

    def start_node(
        self, index: int, nnodes: str, flags: list[str], env: dict[str, str] | None = None
    ) -> None:
        log = self.tmp / f"node{index}.log"
        if self.etcd is not None:
            rdzv = ["--rdzv-backend=etcd", f"--rdzv-endpoint={self.etcd}"]
            rdzv.append(f"--rdzv-conf={self.conf}")
        else:
            rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}"]
            rdzv.append(f"--rdzv-conf={self.conf},is_host={'true' if index == 0 else 'false'}")
        cmd = [
            *RTRAIN,
            f"--nnodes={nnodes}",
            *rdzv,
            f"--local-addr=127.0.0.{index + 1}",
            f"--rdzv-id={self.run_id}",
            f"--log-dir={self.tmp / 'logs'}",  # a test's own --log-dir comes later, and wins
            *flags,
            self.script,
            *self.script_args,
        ]
        handle = open(log, "w")  # noqa: SIM115 - the node writes to it until it exits
        proc = subprocess.Popen(
            cmd,
            env={**self.env, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        if index < len(self.procs):
            self.procs[index], self.logs[index] = proc, log
        else:
            self.procs.append(proc)
            self.logs.append(log)

    def start_standby(
        self,
        index: int,
        nnodes: str,
        flags: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> None:
        """Start node `index` once round 0 has closed (a generation started): it joins
        the next round and waits there as a standby."""
        deadline = time.monotonic() + timeout
        while not self.events("generation_start"):
            assert time.monotonic() < deadline, self.log(0)
            time.sleep(0.05)
        self.start_node(index, nnodes, flags, env)

    def node_pids(self, index: int) -> list[int]:
        """The node's agent and every process under it (pool, workers)."""
        agent = psutil.Process(self.procs[index].pid)
        return [agent.pid, *(p.pid for p in agent.children(recursive=True))]

    def kill_node(self, index: int) -> float:
        pids = self.node_pids(index)
        when = time.time()
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        return when

    def replace_node(self, index: int, nnodes: str, flags: list[str], pause: float = 1.0) -> None:
        """Kill node `index` whole and start an empty replacement at its address."""
        self.kill_node(index)
        time.sleep(pause)
        self.start_node(index, nnodes, flags)

    def stop_agent(self, index: int) -> float:
        when = time.time()
        os.kill(self.procs[index].pid, signal.SIGSTOP)
        return when

    def cont_agent(self, index: int) -> None:
        os.kill(self.procs[index].pid, signal.SIGCONT)

    def progress(self) -> int:
        """Steps applied so far (rank 0 writes it after every step)."""
        path = self.out / "progress"
        try:
            return int(path.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def wait_progress(self, steps: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while self.progress() < steps:
            assert time.monotonic() < end, f"training never reached step {steps}:\n{self.log(0)}"
            time.sleep(0.05)

    def kill_node_at(self, steps: int, index: int, timeout: float = 120) -> list[int | None]:
        """Once training has applied `steps` steps, SIGKILL node `index` whole; every
        node's exit code (None: still running after `timeout`). Closes the cluster."""
        try:
            self.wait_progress(steps)
            self.kill_node(index)
            return self.wait(timeout)
        finally:
            self.close()

    def wait(self, timeout: float = 120) -> list[int | None]:
        return self.wait_some(list(range(len(self.procs))), timeout)

    def finish(self, timeout: float = 120) -> list[int | None]:
        """Every node's exit code (wait), the cluster closed after it even if the wait
        raises: a node still running at `timeout` (its code None) is stopped."""
        try:
            return self.wait(timeout)
        finally:
            self.close()

    def wait_some(self, indices: list[int], timeout: float) -> list[int | None]:
        """The exit codes of the nodes at `indices` (None: still running after `timeout`)."""
        end = time.monotonic() + timeout
        codes = []
        for index in indices:
            try:
                codes.append(self.procs[index].wait(timeout=max(end - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                codes.append(None)
        if None in codes:
            self.dump_stacks()
        return codes

    def dump_stacks(self) -> None:
        """Nodes still running past a wait: every process's stack (py-spy, native frames
        too) and TCP connections, then each agent's native threads (gdb), into
        node<i>.stacks and this test's output, so a hang that fails a test once in a
        while says where it was. Workers first, every node's, before any gdb: gdb stops
        an agent while it reads it, its lease lapses, and the other nodes move on."""
        running: dict[int, list[int]] = {}
        for index, proc in enumerate(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(psutil.Error):
                    running[index] = self.node_pids(index)
        parts = {i: [f"node {i}: still running; {self.progress()} steps applied"] for i in running}
        for index, pids in running.items():
            for pid in reversed(pids):  # the workers, then the pool, then the agent
                parts[index] += [_process_context(pid), _py_spy(pid)]
        for index, pids in running.items():
            parts[index].append(_native_threads(pids[0]))
            text = "\n".join(parts[index])
            (self.tmp / f"node{index}.stacks").write_text(text)
            print(text, flush=True)

    def log(self, index: int) -> str:
        return self.logs[index].read_text()

    def records(self) -> dict[tuple[int, int], dict[str, Any]]:
        found = {}
        for path in sorted(self.out.glob("gen*_rank*.json")):
            gen, rank = path.stem.removeprefix("gen").split("_rank")
            found[(int(gen), int(rank))] = json.loads(path.read_text())
        return found

    def events(self, name: str | None = None) -> list[Event]:
        """Every node's structured events (of one kind), in time order."""
        return events_under(self.tmp / "logs", name)

    def fault_time(self, rank: int) -> float:
        return json.loads((self.out / f"fault_rank{rank}.json").read_text())["t_fault"]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    pids = self.node_pids(self.procs.index(proc))
                except psutil.Error:
                    pids = [proc.pid]
                for pid in pids:
                    _signal(pid, signal.SIGCONT)
                    _signal(pid, signal.SIGKILL)
                proc.wait()
        if self._held is not None:
            self._held.close()


def stop_agent_until_gone_on(
    cluster: LocalCluster, index: int, gone_on: Callable[[], bool]
) -> tuple[list[int | None], list[int]]:
    """SIGSTOP node `index`'s agent (its workers run on) once training runs, until
    gone_on() says the others went on without it; then SIGCONT it. Every node's exit
    code, and the pids of the stopped node's workers. Closes the cluster."""
    try:
        cluster.wait_progress(5)
        stale_workers = cluster.node_pids(index)[2:]
        cluster.stop_agent(index)
        end = time.monotonic() + 30
        while not gone_on():
            assert time.monotonic() < end, cluster.log(0)
            time.sleep(0.1)
        cluster.cont_agent(index)
        return cluster.wait(), stale_workers
    finally:
        cluster.close()


def assert_fenced_and_back(cluster: LocalCluster, stale_workers: list[int], steps: int) -> None:
    """The stale node's generation-0 workers are gone and none of them finished; it came
    back at a generation boundary, so the last generation has all 6 workers again."""
    assert not any(alive(pid) for pid in stale_workers)
    assert not any(gen == 0 for gen, _ in cluster.records())
    final = final_records(cluster)
    assert sorted(final) == list(range(6))
    for rec in final.values():
        assert rec["applied"] == steps


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def final_records(cluster: LocalCluster) -> dict[int, dict]:
    """rank -> record of the last generation that finished."""
    found = cluster.records()
    last = max(gen for gen, _ in found)
    return {rank: rec for (gen, rank), rec in found.items() if gen == last}


def assert_same_weights(ours: list[float], reference: list[float]) -> None:
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference, strict=True):
        assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), (ours, reference)


def _py_spy(pid: int) -> str:
    try:
        dump = subprocess.run(
            ["py-spy", "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pid {pid}: no stack ({exc})"
    return dump.stdout + dump.stderr[-500:]


def _native_threads(pid: int) -> str:
    """Every thread of the agent, C++ ones included (the TCPStore servers it hosts run
    in threads py-spy does not list), where gdb is installed."""
    if shutil.which("gdb") is None:
        return f"pid {pid}: no gdb here for its native threads"
    try:
        dump = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pid {pid}: gdb failed ({exc})"
    threads = [line for line in dump.stdout.splitlines() if line.startswith(("Thread", "#"))]
    return f"pid {pid} native threads:\n" + "\n".join(threads)


def _socket_queues() -> dict[tuple[int, int], str]:
    """(local port, remote port) -> the bytes in its send and receive queues, from
    /proc/net/tcp and tcp6: whether a request that got no answer is still waiting on
    the client's side, waits unread at the server, or was read (both queues empty)."""
    queues: dict[tuple[int, int], str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, (tx, rx) = fields[1], fields[2], fields[4].split(":")
                ports = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
                queues[ports] = f"send-q {int(tx, 16)} recv-q {int(rx, 16)}"
    return queues


def _process_context(pid: int) -> str:
    """What a stack alone does not say about a stuck worker: its TCP connections (a
    connect to a port nobody serves looks like any other wait inside TCPStore's
    constructor) and their queues. Not its environment: a forked worker's /proc
    environ is the pool's."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
        queues = _socket_queues()
        links = [
            f"{c.laddr.ip}:{c.laddr.port}->{c.raddr.ip}:{c.raddr.port} {c.status} "
            f"{queues.get((c.laddr.port, c.raddr.port), '')}".rstrip()
            for c in conns
            if c.raddr
        ]
        listening = [
            f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN
        ]
    except psutil.Error as exc:
        return f"pid {pid}: {exc!r}"
    return f"pid {pid}: listening {listening}; connections {links}"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
