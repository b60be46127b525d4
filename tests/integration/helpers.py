"""Helpers for integration tests: real rtrain and torchrun processes on localhost."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rtrain.core.observe.events import EVENTS_FILE, Event, read_events

ROOT = Path(__file__).resolve().parents[2]
PROBE = str(ROOT / "tests" / "scripts" / "train_probe.py")
RTRAIN = [sys.executable, "-m", "rtrain.cli.main", "launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


class HeldPort:
    """A port held for a process this test starts, which binds it itself: rtrain and
    torchrun take a port number, not a listening socket, so the number comes first.

    A number picked by binding port 0 and let go at once is free for the kernel to
    give to anything until the process binds it (another test's port 0, an
    outgoing connection's local port): EADDRINUSE in CI. Held instead, from the pick
    until close(): bound here on every address, alone (the bind fails if anything holds
    the port), then marked SO_REUSEADDR and never listening. While held, the kernel
    gives the number to no other bind(0) and to no outgoing connection, and a plain
    bind of it fails; the process still binds and listens on it (Linux shares a port
    between a listener and bound sockets that do not listen, when all of them set
    SO_REUSEADDR, as rtrain's store and metrics server, torch's TCPStore and etcd do),
    and connections reach the listener alone: with none, they are refused. So it is
    also a port where nothing answers, and a restarted process finds its port again.
    """

    def __init__(self, port: int = 0) -> None:
        self._sock = socket.socket()
        try:
            self._sock.bind(("0.0.0.0", port))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def probe_env(out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "PROBE_"))}
    env.update({"PROBE_OUT": str(out), "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def run(
    cmd: list[str], env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# torch 2.13's workers die of SIGABRT ("terminate called without an active exception")
# in interpreter teardown about once in 35 torchrun runs here, after the script is done,
# more often on a loaded machine (a fresh-clone CI run saw the DCP client's oracle abort
# three times in a row). rtrain's workers end with os._exit after atexit, so they do
# not; the oracle's own teardown crash is not what a parity test is about, so it gets
# more tries.
ORACLE_TRIES = 5


def run_torchrun(
    args: list[str], env: dict[str, str], timeout: float = 90, fresh: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """fresh: a folder emptied before each try (a retried run must not resume from the
    checkpoint its first try left there)."""
    for _ in range(ORACLE_TRIES):
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
            fresh.mkdir(parents=True)
        result = run([*TORCHRUN, *args], env, timeout)
        if result.returncode == 0 or "(SIGABRT)" not in result.stderr:
            break
    return result


def records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(generation, rank) -> what the probe wrote."""
    found = {}
    for path in sorted(out.glob("gen*_rank*.json")):
        gen, rank = path.stem.removeprefix("gen").split("_rank")
        found[(int(gen), int(rank))] = json.loads(path.read_text())
    return found


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rtrain: error:")]


def events_under(folder: Path, name: str | None = None) -> list[Event]:
    """The structured events of every run under `folder` (of one kind), in time order;
    a line that is not an event fails the test."""
    found: list[Event] = []
    for path in sorted(folder.rglob(EVENTS_FILE)):
        events, bad = read_events(path.read_text().splitlines())
        assert bad == 0, f"{path}: {bad} lines are not events"
        found += events
    return sorted((e for e in found if name is None or e.name == name), key=lambda e: e.t)
