#!/usr/bin/env python3
"""A real 3-member etcd cluster on 127.0.0.1, for rtrain's etcd tests and benchmarks.

    scripts/etcd_cluster.py start [--members 3] [--base-port 23790]   # prints the endpoints
    scripts/etcd_cluster.py stop
    scripts/etcd_cluster.py status                                      # member, pid, leader
    scripts/etcd_cluster.py kill|pause|resume|restart NAME              # e0, e1, e2

Member i listens for clients on base-port + i and for peers on base-port + 100 + i.
Everything (data, logs, pid files) lives in $RTRAIN_ETCD_DIR (default /tmp/rtrain-etcd).
Needs Debian's etcd-server package (3.4; .ci/run installs it). Tests import EtcdCluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = os.environ.get("RTRAIN_ETCD_DIR", "/tmp/rtrain-etcd")
DEFAULT_BASE_PORT = 23790
# Shorter than etcd's defaults (100 ms, 1000 ms) so that a killed leader is replaced
# within about a second on a loaded 2-core machine; still 10 heartbeats per election.
HEARTBEAT_MS = 100
ELECTION_MS = 1000
START_TIMEOUT_S = 30.0


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


class EtcdCluster:
    def __init__(
        self, directory: str = DEFAULT_DIR, members: int = 3, base_port: int = DEFAULT_BASE_PORT
    ) -> None:
        self.dir = Path(directory)
        self.members = [Member(f"e{i}", base_port + i, base_port + 100 + i) for i in range(members)]
        self.token = f"rtrain-{base_port}"

    @property
    def endpoints(self) -> str:
        """The --rdzv-endpoint value for this cluster."""
        return ",".join(m.endpoint for m in self.members)

    def member(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise SystemExit(
            f"etcd_cluster: no member {name!r} (members: e0..e{len(self.members) - 1})"
        )

    # -- processes --

    def _pid_file(self, member: Member) -> Path:
        return self.dir / f"{member.name}.pid"

    def pid(self, member: Member) -> int | None:
        try:
            pid = int(self._pid_file(member).read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def _launch(self, member: Member, state: str) -> None:
        initial = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
        data = self.dir / member.name
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / f"{member.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [
                shutil.which("etcd") or "etcd",
                f"--name={member.name}",
                f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{member.client_port}",
                f"--advertise-client-urls=http://127.0.0.1:{member.client_port}",
                f"--listen-peer-urls=http://127.0.0.1:{member.peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{member.peer_port}",
                f"--initial-cluster={initial}",
                f"--initial-cluster-state={state}",
                f"--initial-cluster-token={self.token}",
                f"--heartbeat-interval={HEARTBEAT_MS}",
                f"--election-timeout={ELECTION_MS}",
                "--log-level=warn",
                "--logger=zap",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._pid_file(member).write_text(str(proc.pid))

    def start(self) -> None:
        """A fresh cluster (any old one in the folder is stopped and wiped)."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        for member in self.members:
            self._launch(member, "new")
        self.wait_healthy()

    def stop(self) -> None:
        for member in self.members:
            self.kill(member.name)

    def kill(self, name: str) -> None:
        member = self.member(name)
        pid = self.pid(member)
        if pid is None:
            return
        os.kill(pid, signal.SIGCONT)  # a paused member dies too
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.pid(member) is not None and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.02)

    def pause(self, name: str) -> None:
        pid = self.pid(self.member(name))
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        pid = self.pid(self.member(name))
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def restart(self, name: str) -> None:
        """Start a killed member again on its data (it rejoins the cluster it was in)."""
        member = self.member(name)
        if self.pid(member) is None:
            self._launch(member, "existing")
        self.wait_healthy([member])

    # -- state --

    def status(self, member: Member, timeout: float = 1.0) -> dict[str, object] | None:
        """The member's /v3/maintenance/status answer, or None if it does not answer."""
        request = urllib.request.Request(
            f"http://{member.endpoint}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def leader(self) -> str | None:
        """The name of the member that leads, as the members that answer see it."""
        for member in self.members:
            answer = self.status(member)
            if answer is None:
                continue
            leader = str(answer.get("leader", ""))
            for candidate in self.members:
                status = self.status(candidate)
                if status is not None and str(status["header"]["member_id"]) == leader:  # type: ignore[index]
                    return candidate.name
        return None

    def wait_healthy(self, members: list[Member] | None = None) -> None:
        """Until every member answers and the cluster has a leader that takes a write."""
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = members or self.members
        while time.monotonic() < deadline:
            if all(self.status(m) for m in waiting) and self._writable(waiting[0]):
                return
            time.sleep(0.1)
        raise SystemExit(
            f"etcd_cluster: not healthy within {START_TIMEOUT_S:g}s; see {self.dir}/*.log"
        )

    def _writable(self, member: Member) -> bool:
        body = json.dumps({"key": "X3J0cmFpbl9oZWFsdGg=", "value": "MQ=="}).encode()
        request = urllib.request.Request(
            f"http://{member.endpoint}/v3/kv/put", data=body, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=2.0) as answer:
                return "header" in json.loads(answer.read())
        except (OSError, ValueError, urllib.error.URLError):
            return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["start", "stop", "status", "kill", "pause", "resume", "restart"]
    )
    parser.add_argument("name", nargs="?")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    parser.add_argument("--dir", default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if shutil.which("etcd") is None:
        print("etcd_cluster: no etcd binary (apt-get install etcd-server)", file=sys.stderr)
        return 69
    cluster = EtcdCluster(args.dir, args.members, args.base_port)
    if args.command in ("kill", "pause", "resume", "restart"):
        if not args.name:
            print(
                f"etcd_cluster: {args.command} needs a member name (e0, e1, ...)", file=sys.stderr
            )
            return 64
        getattr(cluster, args.command)(args.name)
    elif args.command == "start":
        cluster.start()
        print(cluster.endpoints)
    elif args.command == "stop":
        cluster.stop()
    else:
        leader = cluster.leader()
        for member in cluster.members:
            state = "up" if cluster.status(member) else "down"
            mark = " (leader)" if member.name == leader else ""
            print(f"{member.name} {member.endpoint} pid={cluster.pid(member)} {state}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
