"""The worker pool: one process per node that imports torch once and forks workers.

A restart then costs a fork, not a Python start-up plus `import torch` per worker.
The agent talks to the zygote over a socketpair, one JSON object per line:

  agent -> zygote   {"op": "spawn", "id": ..., "kind", "target", "args", "env", "cwd",
                     "stdout_file", "stderr_file"}
                    {"op": "signal", "sig": N, "id": ...}   (that worker's process group;
                                                            without "id", every worker's)
                    {"op": "prefork", "id": ...}   (fork a spare for that worker id now;
                                                    its spawn hands the spare the request)
                    {"op": "drop_spares"}   (kill the spares no spawn took)
                    {"op": "rename", "pid": N, "id": ...}   (a warm spare that took a
                                                            rank: its id from now on)
                    {"op": "standby", "ids": [...]}   (a standby node: warm up now, at
                                                       the normal priority, then fork a
                                                       spare for each worker id)
  zygote -> agent   {"ev": "ready", "preload_errors": {...}}
                    {"ev": "started", "id": ..., "pid": N, "fresh": why or ""}
                    {"ev": "refused", "id": ..., "error": ...}   (CUDA initialized here)
                    {"ev": "exited", "id": ..., "pid": N, "exitcode": N, "time": T}
                    (exitcode negative: killed by that signal; time: when it was reaped)

The zygote reaps its children (it is their parent) in its SIGCHLD handler, so an exit is
reported, with the time it happened, even while the zygote is busy importing modules for
later restarts (seconds of torch._dynamo): a reap delayed past the agent's stop would
make a worker that failed on its own look stopped, and charge its failure to a victim.
It dies with the agent (parent-death signal), and its workers die with it; if the
agent's socket closes, it kills every worker before exiting.

A spare (prefork) is a child forked ahead of its spawn, blocked on a pipe until the
spawn's request arrives: a repair in place forks the failed worker's replacement as soon
as the fault is seen, while the survivors park and the next round closes, so the fork
(and a wait for the warm-up's imports) is off the critical path (spare.py). A standby
node (a hot spare beyond --nnodes' max) warms up as soon as it waits, and forks its
workers' spares once the warm-up is done: its takeover of a lost node's ranks hands
them their requests, never a fresh interpreter for a warm-up starved on a busy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from .autogroup import lead_own_session
from .boot import boot, fresh_interpreter, prepare_titles, set_parent_death_signal
from .spare import Spares
from .warm_up import WarmUp, preload

CUDA_REFUSAL = (
    "CUDA is initialized in the worker pool (a --preload module used it), and a forked "
    "worker cannot use it: preload only modules that leave CUDA alone, or pass "
    "--preload none"
)


def cuda_initialized() -> bool:
    """Whether the pool's torch initialized CUDA; asks without initializing it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda is not None and bool(cuda.is_initialized())
    except Exception:  # a torch half imported, or one without CUDA support
        return False


class Zygote:
    def __init__(self, sock: socket.socket, parent_pid: int) -> None:
        self._sock = sock
        self._parent_pid = parent_pid
        self._children: dict[int, str] = {}
        self.warm_later: list[str] = []
        # The warm-up waits until nothing came from the agent for this long (a spawn's
        # workers are then past their first seconds: see WorkerPool's warm_after).
        self.warm_after = 0.2
        self._last_message = time.monotonic()
        self._warmer: WarmUp | None = None
        self._buffer = b""
        # Set while lines are written: a report from the SIGCHLD handler then waits in
        # _queued instead of landing in the middle of a line.
        self._sending = False
        self._queued: list[bytes] = []
        self._reaping = False
        # Exits of children reaped before _spawn registered them (a child that died at once).
        self._early_exits: dict[int, tuple[int, float]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        self._spares = Spares()
        self._standby: list[str] = []  # worker ids to fork spares for once warm

    def send(self, message: dict[str, Any]) -> None:
        self._queued.append((json.dumps(message) + "\n").encode())
        self.flush()

    def flush(self) -> None:
        """Write the queued lines, unless this is the SIGCHLD handler interrupting a write:
        that write goes on with what the handler queued (or the main loop does)."""
        if self._sending:
            return
        self._sending = True
        try:
            while self._queued:
                self._sock.sendall(self._queued.pop(0))
        except (BrokenPipeError, ConnectionResetError):
            # The agent is gone; its socket's end is what serve() acts on. Not raised
            # here: this may be the SIGCHLD handler reporting a worker killed because of
            # it (a warm spare still waiting when the job ended), after serve returned.
            self._queued.clear()
        finally:
            self._sending = False

    def serve(self) -> None:
        # The wakeup fd makes select return for a report queued by the handler.
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: self._reap())
        while True:
            idle_s = min(0.2, self.warm_after) if self.warm_later or self._standby else 1.0
            watched: list[Any] = [self._sock, self._wake_r]
            readable, _, _ = select.select(watched, [], [], idle_s)
            quiet = time.monotonic() - self._last_message >= self.warm_after
            if not readable and self.warm_later and self._warmer is None and quiet:
                # Idle: import what workers will import anyway (see WorkerPool), so that
                # restarted workers skip it, without making the first start wait for it.
                self._warmer = WarmUp(self.warm_later)
                self.warm_later = []
            if self._standby and (self._warmer is None or not self._warmer.running):
                for worker_id in self._standby:
                    self._prefork(worker_id)
                self._standby = []
            if self._wake_r in readable:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            self._reap()
            self.flush()  # a report queued by the handler while a line was written
            if self._sock in readable:
                data = self._sock.recv(1 << 16)
                if not data:  # the agent is gone
                    self._signal_all(signal.SIGKILL)
                    self._spares.drop()
                    return
                self._buffer += data
                self._last_message = time.monotonic()
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    self._handle(json.loads(line))

    def _handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "spawn":
            self._spawn(message)
        elif op == "signal":
            self._signal_all(int(message["sig"]), message.get("id"))
        elif op == "prefork":
            self._prefork(str(message["id"]))
        elif op == "drop_spares":
            self._spares.drop()
        elif op == "rename":
            if int(message["pid"]) in self._children:  # not reaped yet
                self._children[int(message["pid"])] = str(message["id"])
        elif op == "standby":
            self._become_standby([str(i) for i in message.get("ids") or []])
        elif op == "exit":
            self._signal_all(signal.SIGKILL)
            self._spares.drop()
            raise SystemExit(0)

    def _become_standby(self, worker_ids: list[str]) -> None:
        """A standby node: its warm-up starts now at the normal priority (or goes on at
        it), and its workers' spares are forked once it is done (serve's loop)."""
        if self.warm_later and self._warmer is None:
            self._warmer = WarmUp(self.warm_later, idle=False)
            self.warm_later = []
        elif self._warmer is not None and self._warmer.running:
            self._warmer.hurry()
        self._standby = worker_ids

    def _warm_done(self) -> bool:
        """Whether a Python worker may be forked now (no warm-up inside an import)."""
        return self._warmer is None or self._warmer.finish()

    def _inherited(self) -> list[int]:
        return [self._sock.fileno(), self._wake_r, self._wake_w, *self._spares.fds]

    def _prefork(self, worker_id: str) -> None:
        """Fork a spare for `worker_id` now, unless one waits already, CUDA is
        initialized, or the warm-up is still importing (its spawn then goes as before)."""
        if worker_id in self._spares or cuda_initialized() or not self._warm_done():
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._spares.fork(worker_id, os.getpid(), self._inherited())

    def _spawn(self, request: dict[str, Any]) -> None:
        if cuda_initialized():
            self._spares.drop()
            self.send({"ev": "refused", "id": request["id"], "error": CUDA_REFUSAL})
            return
        spare = self._spares.take(request["id"])
        if spare is not None:
            # The SIGCHLD handler may reap the spare at any point here: until it is in
            # _children its exit waits in _early_exits, as a fresh fork's does.
            if spare.hand(request):
                self._children[spare.pid] = request["id"]
                self.send({"ev": "started", "id": request["id"], "pid": spare.pid, "fresh": ""})
                early = self._early_exits.pop(spare.pid, None)
                if early is not None:
                    self._report_exit(spare.pid, *early)
                return
            # It died waiting: its exit is nobody's, and a worker is forked as before.
            self._spares.ignore(spare.pid)
            if self._early_exits.pop(spare.pid, None) is not None:  # reaped already
                self._spares.reaped(spare.pid)
        fresh = ""
        asked = time.monotonic()
        warm = request["kind"] == "exec" or self._warm_done()
        waited = time.monotonic() - asked  # reported: it explains a slow recovery
        if not warm:
            # A Python worker forked while the warm-up thread is inside an import would
            # deadlock on that module's lock (or find it half done), and a warm-up starved
            # at idle priority on a loaded node took minutes: the worker starts at once as
            # a fresh interpreter instead (exec straight after the fork).
            request = fresh_interpreter(request)
            fresh = "the pool's warm-up imports, at idle priority, were starved or slow"
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        zygote_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            boot(request, zygote_pid, self._inherited())
        self._children[pid] = request["id"]
        self.send(
            {
                "ev": "started",
                "id": request["id"],
                "pid": pid,
                "fresh": fresh,
                "warm_wait_s": round(waited, 3),
            }
        )
        early = self._early_exits.pop(pid, None)
        if early is not None:
            self._report_exit(pid, *early)

    def _signal_all(self, sig: int, worker_id: str | None = None) -> None:
        # Only unreaped children are signalled, so a pid is never a recycled one.
        for pid, wid in list(self._children.items()):
            if worker_id is not None and wid != worker_id:
                continue
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def _reap(self) -> None:
        """Reap every exited child; runs in the SIGCHLD handler and in the main loop."""
        if self._reaping:  # the handler interrupted the main loop's reap: it goes on
            return
        self._reaping = True
        try:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    return
                code, when = os.waitstatus_to_exitcode(status), time.time()
                if self._spares.reaped(pid):  # a spare no spawn took
                    continue
                if pid in self._children:
                    self._report_exit(pid, code, when)
                else:  # forked, but _spawn has not registered it yet
                    self._early_exits[pid] = (code, when)
        finally:
            self._reaping = False

    def _report_exit(self, pid: int, code: int, when: float) -> None:
        worker_id = self._children.pop(pid)
        self.send({"ev": "exited", "id": worker_id, "pid": pid, "exitcode": code, "time": when})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rtrain-zygote")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--warm-later", default="")
    parser.add_argument("--warm-after", type=float, default=0.2)
    args = parser.parse_args(argv)
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        return
    prepare_titles()  # while the environment is still exec's: each worker's own title
    # A session of its own: where the kernel groups CPU time by session (autogroup), the
    # warm-up's idle priority then counts against the workers' sessions (autogroup.py).
    lead_own_session()
    # Ctrl-C reaches the whole foreground group, and Slurm signals every process of a
    # step (--signal=USR1@T, the time limit's SIGTERM): the agent decides what the
    # workers get, and the pool lives exactly as long as the agent (parent-death signal).
    # Workers set these back to their defaults.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    zygote = Zygote(sock, parent)
    modules = [m for m in args.preload.split(",") if m]
    errors = preload(modules)
    zygote.warm_later = [m for m in args.warm_later.split(",") if m]
    zygote.warm_after = args.warm_after
    try:
        zygote.send({"ev": "ready", "preload_errors": errors})
        zygote.serve()
    except (BrokenPipeError, ConnectionResetError):
        # The agent went away (it may fail before the preload is even done): so do we.
        zygote._signal_all(signal.SIGKILL)


if __name__ == "__main__":
    main()
