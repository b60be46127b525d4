"""WorkerPool: the agent's side of the zygote protocol (see zygote.py)."""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.errors import ExitCode, RtrainError

logger = logging.getLogger(__name__)

# What most training scripts import at their first optimizer step (1.2 s of torch._dynamo).
WARM_LATER = ("torch._dynamo",)
# The warm-up starts once the agent sent the pool nothing for this long: not while a
# generation's workers take their first steps (1-3 s of CPU, even at idle priority,
# beside a one-second loop's two workers on two cores), and done long before a typical
# restart. A restart that comes first forks at once; its workers import what they use.
WARM_AFTER_S = 10.0
# How often a spawn the pool has not answered yet says that it still waits.
NOTICE_S = 10.0
# Lets torch.cuda.is_available() in a preload module ask NVML, not initialize CUDA
# (which a forked worker could not use).
POOL_ONLY_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


class PoolDied(RtrainError):
    """The zygote exited; every worker it held is gone with it."""


class PoolRefused(RtrainError):
    """The pool would not fork a worker (CUDA is initialized in it): a setup error."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class WorkerExit:
    worker_id: str
    pid: int
    exitcode: int
    time: float


class WorkerPool:
    def __init__(
        self,
        preload: tuple[str, ...],
        env: Mapping[str, str],
        warm_later: tuple[str, ...] | None = None,
        notice_s: float = NOTICE_S,
        warm_after: float = WARM_AFTER_S,
    ) -> None:
        """warm_later: modules the zygote imports once it is idle after its start (default:
        torch._dynamo when torch is preloaded), warm_after: idle for that long (seconds);
        notice_s: how often a slow spawn is logged."""
        self._notice_s = notice_s
        self._warm_after = warm_after
        self._preload = preload
        if warm_later is None:
            warm_later = WARM_LATER if "torch" in preload else ()
        self._warm_later = warm_later
        self._env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ready = False
        self._pending: list[dict[str, Any]] = []
        self._spares = False  # a prefork was sent since the last drop
        # seconds spawns waited for the warm-up's imports since the last take_warm_wait()
        self._warm_wait_s = 0.0

    @property
    def env(self) -> dict[str, str]:
        """The environment the zygote was started with (and imported the preload in)."""
        return dict(self._env)

    def start(self) -> None:
        """Start the zygote; it imports the preload modules while the agent does rendezvous."""
        ours, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtrain.agent.workers.zygote",
                "--fd",
                str(theirs.fileno()),
                "--preload",
                ",".join(self._preload),
                "--warm-later",
                ",".join(self._warm_later),
                "--warm-after",
                str(self._warm_after),
            ],
            pass_fds=(theirs.fileno(),),
            env={**self._env, **POOL_ONLY_ENV},
        )
        theirs.close()
        self._sock = ours
        self._ready = False
        self._buffer = b""
        self._pending = []

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ensure_running(self) -> None:
        if not self.running:
            if self._proc is not None:
                logger.warning(
                    "the worker pool exited (code %s); starting a new one", self._proc.returncode
                )
            self.close()
            self.start()

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        assert self._sock is not None
        readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        if not readable:
            return []
        try:
            data = self._sock.recv(1 << 16)
        except OSError as exc:
            raise PoolDied(f"the worker pool's connection broke ({exc})") from None
        if not data:
            raise PoolDied("the worker pool closed its connection")
        self._buffer += data
        messages = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            messages.append(json.loads(line))
        return messages

    def _await(
        self, events: tuple[str, ...], timeout: float, worker_id: str | None = None, what: str = ""
    ) -> dict[str, Any]:
        """The first message of one of `events` (for `worker_id`); with `what`, a line every
        notice_s says that it still waits, and only the pool's exit or `timeout` end it.
        (The OS's clock, not the job's: it times select() on the pool's pipe.)"""
        start = time.monotonic()
        end, notice = start + timeout, start + self._notice_s
        while True:
            for index, message in enumerate(self._pending):
                if message.get("ev") in events and (
                    worker_id is None or message.get("id") == worker_id
                ):
                    return self._pending.pop(index)
            now = time.monotonic()
            if now >= end:
                raise PoolDied(f"the worker pool did not answer ({events[0]}) within {timeout:g}s")
            if what and now >= notice:
                notice = now + self._notice_s
                if not self.running:
                    raise PoolDied(f"the worker pool exited before it had {what}")
                logger.warning(
                    "the worker pool has not %s after %.0fs (a loaded node?); waiting up to %gs",
                    what,
                    now - start,
                    timeout,
                )
            wait = min(end, notice) - now if what else end - now
            self._pending.extend(self._read(wait))

    def wait_ready(self, timeout: float = 120.0) -> dict[str, str]:
        if self._ready:
            return {}
        preload = ", ".join(self._preload) or "nothing"
        message = self._await(("ready",), timeout, what=f"imported its preload ({preload})")
        self._ready = True
        errors = dict(message.get("preload_errors") or {})
        for module, error in errors.items():
            logger.warning(
                "could not preload %s (%s); workers will import it themselves", module, error
            )
        return errors

    def spawn(self, request: dict[str, Any], timeout: float = 600.0) -> int:
        """Fork (or start) a worker; its pid. A slow answer (a loaded node) is waited for,
        with a line every notice_s, up to `timeout`."""
        deadline = time.monotonic() + timeout  # _await's clock: the pipe's, the OS's
        self.wait_ready(timeout)
        self._send({"op": "spawn", **request})
        what = f"worker {request['id']}"
        left = max(deadline - time.monotonic(), 0.0)
        answer = self._await(("started", "refused"), left, request["id"], f"started {what}")
        if answer["ev"] == "refused":
            raise PoolRefused(str(answer.get("error", "the worker pool refused to fork")))
        if answer.get("fresh"):
            logger.info("%s started as a fresh interpreter: %s", what, answer["fresh"])
        self._warm_wait_s += float(answer.get("warm_wait_s") or 0.0)
        return int(answer["pid"])

    def take_warm_wait(self) -> float:
        """Seconds the spawns since the last call waited for the pool's warm-up imports
        (a fork must not come while they are inside an import: warm_up.py), and reset."""
        waited, self._warm_wait_s = self._warm_wait_s, 0.0
        return waited

    def prefork(self, worker_id: str) -> None:
        """Have the pool fork worker `worker_id`'s process now, ahead of its spawn (which
        then hands it the request): a repair in place's replacement, forked while the
        survivors park. Not waited for; a pool that cannot (the warm-up importing, CUDA
        initialized) forks at the spawn as before."""
        if self.running and self._ready:
            self._send({"op": "prefork", "id": worker_id})
            self._spares = True

    def standby(self, worker_ids: list[str]) -> None:
        """This node waits as a standby: the zygote warms up now, at the normal priority,
        and then forks a spare for each of these worker ids, which a takeover's spawns
        hand their requests (spare.py). Not waited for."""
        if self.running:
            self._send({"op": "standby", "ids": worker_ids})
            self._spares = True

    def drop_spares(self) -> None:
        """Kill the spares no spawn took (after a generation's spawns)."""
        if self._spares and self.running:
            self._send({"op": "drop_spares"})
        self._spares = False

    def rename(self, pid: int, worker_id: str) -> None:
        """Worker `pid` (a warm spare that took a rank) is `worker_id` from now on: its
        signals and its exit go by that id."""
        if self.running:
            self._send({"op": "rename", "pid": int(pid), "id": worker_id})

    def signal_all(self, sig: int) -> None:
        if self.running:
            self._send({"op": "signal", "sig": int(sig)})

    def signal(self, worker_id: str, sig: int) -> None:
        if self.running:
            self._send({"op": "signal", "sig": int(sig), "id": worker_id})

    def poll_exits(self, timeout: float) -> list[WorkerExit]:
        """Worker exits reported since the last call, waiting up to `timeout` for the first."""
        if not any(m.get("ev") == "exited" for m in self._pending):
            self._pending.extend(self._read(timeout))
        exits = [m for m in self._pending if m.get("ev") == "exited"]
        self._pending = [m for m in self._pending if m.get("ev") != "exited"]
        return [
            WorkerExit(m["id"], int(m["pid"]), int(m["exitcode"]), float(m["time"])) for m in exits
        ]

    def _send(self, message: dict[str, Any]) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            raise PoolDied("the worker pool is gone") from None

    @property
    def pids(self) -> list[int]:
        """The pool's own process (the zygote), while it runs."""
        return [self._proc.pid] if self._proc is not None and self._proc.poll() is None else []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote kills its workers when this closes
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
