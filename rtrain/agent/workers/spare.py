"""Spares: workers forked by the zygote ahead of their spawn (the "prefork" op).

A spare is a child of the zygote blocked on a pipe. The spawn for its worker id writes
the request (JSON: the same dictionary a fork would boot with) and closes the pipe; the
spare then boots as any forked worker does. A spare whose pipe closes with nothing in
it (dropped, or the zygote died) exits 0 without a word. Used by a repair in place
(agent/repair/): the failed worker's replacement is forked when the fault is seen,
while the survivors park, instead of after the next round closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .boot import EXEC_FAILED, boot, set_parent_death_signal


@dataclass
class Spare:
    pid: int
    fd: int  # the write end of its request pipe

    def hand(self, request: dict[str, Any]) -> bool:
        """Give the spare its request; False when it is gone."""
        try:
            data = json.dumps(request).encode()
            while data:
                data = data[os.write(self.fd, data) :]
            return True
        except OSError:  # BrokenPipeError: it died while it waited
            return False
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class Spares:
    def __init__(self) -> None:
        self._waiting: dict[str, Spare] = {}
        self._dropped: set[int] = set()  # killed, not reaped yet

    def __contains__(self, worker_id: str) -> bool:
        return worker_id in self._waiting

    @property
    def fds(self) -> list[int]:
        """The write ends the zygote holds (a child it forks closes them)."""
        # list() copies in one step: the SIGCHLD handler may reap a spare mid-loop.
        return [spare.fd for spare in list(self._waiting.values())]

    def fork(self, worker_id: str, zygote_pid: int, inherited_fds: Sequence[int]) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            _wait_for_request(read_fd, zygote_pid, inherited_fds)
        os.close(read_fd)
        self._waiting[worker_id] = Spare(pid, write_fd)

    def take(self, worker_id: str) -> Spare | None:
        return self._waiting.pop(worker_id, None)

    def drop(self) -> None:
        """Kill every spare no spawn took; their exits are not reported."""
        # The SIGCHLD handler reaps (`reaped`) between any two bytecodes of this loop:
        # the spares leave `_waiting`, and each pid is marked dropped, before its kill.
        waiting, self._waiting = self._waiting, {}
        for spare in waiting.values():
            self._dropped.add(spare.pid)
            with contextlib.suppress(OSError):
                os.close(spare.fd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare.pid, signal.SIGKILL)

    def ignore(self, pid: int) -> None:
        """A spare taken that was gone: its exit is not a worker's."""
        self._dropped.add(pid)

    def reaped(self, pid: int) -> bool:
        """Whether `pid` was a spare's (dropped, or died waiting): nothing to report."""
        if pid in self._dropped:
            self._dropped.discard(pid)
            return True
        for worker_id, spare in list(self._waiting.items()):
            if spare.pid == pid:
                with contextlib.suppress(OSError):
                    os.close(spare.fd)
                del self._waiting[worker_id]
                return True
        return False


def _wait_for_request(read_fd: int, zygote_pid: int, inherited_fds: Sequence[int]) -> NoReturn:
    try:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != zygote_pid:
            os._exit(0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        chunks = []
        while chunk := os.read(read_fd, 1 << 16):
            chunks.append(chunk)
        os.close(read_fd)
        if not chunks:
            os._exit(0)
        request = json.loads(b"".join(chunks))
    except BaseException:  # nothing may unwind back into the zygote's loop
        os._exit(EXEC_FAILED)
    boot(request, zygote_pid, [])
