"""The process group a repairable worker trains in: opened by rtrain, and released
while a collective may be blocked in it on a dead or stopped peer.

Releasing on gloo (torch 2.4-2.13): gloo has no working abort. ProcessGroup.abort()
exists in 2.13 and returns at once, but a thread blocked in a gloo collective stays
blocked until the group's timeout (measured: 60 s of a 60 s timeout, peer SIGSTOPped).
A peer's SIGKILL frees only the ranks connected to it in the running algorithm: in a
ring of 4, a survivor waiting on another survivor stayed blocked 20 s. What works, on
public interfaces only: shut down (shutdown(2), not close) the connected TCP sockets
the group opened, told apart from every other socket of the process by taking the
process's sockets before and after init_process_group, and those of every group
opened since in this generation (new_group's, a 2-D mesh's sub-groups: recorded as
they are made, core/worker/repair/group_registry.py). Each blocked gloo read or
write then fails at once ("Connection closed by peer"); so do the peers' reads on
those connections, so one released survivor frees the others. The listening socket
is left alone (gloo's listener thread aborts the process on an error there), and a
descriptor whose socket changed since (closed, its number reused) is skipped.

The limit (gloo in torch 2.4-2.13; tests/integration/test_repair_release_race.py): a
collective in the middle of a send when the group fails stays blocked until the group's
timeout. A send that did not fit in the socket at once waits in the pair's own transmit
queue, and when the pair fails gloo wakes the pending receives and announced sends but
not the unbound buffer of a queued send (Pair::signalException wakes only op.buf), so
its UnboundBuffer::waitSend sleeps out the timeout on a pair already closed. Nothing in
torch reaches that buffer: ProcessGroup and backend abort() and shutdown() left it
blocked, set_timeout changes only later collectives. It happens when the peer stops or
goes in the middle of a large send, and to about one release in 30 of small tensors
(one in 6 of 16 MiB) when both ends are released together; the agent then stops that
survivor (at once when it says it is stuck: repairable.py, else after its ACK_S) and
restarts it, as without repair.

Backends with an abort of their own (NCCL) get ProcessGroup.abort() as well, on every
group of the process; that path needs a GPU and is checked by scripts/gpu_check.sh,
not by the CPU tests.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from typing import Any

from . import group_registry
from .group_sockets import Socket, process_sockets, shut_all


class TrainingGroup:
    """The default process group of one generation, opened from the environment."""

    def __init__(
        self,
        backend: str | None,
        timeout_s: float | None,
        members: tuple[Any, int, int] | None = None,
    ) -> None:
        """members: (store, rank, world size) of a group of some of the generation's
        workers (the kept ones training on while a replacement starts: through.py);
        None: the generation's whole world, from the environment."""
        import torch.distributed as dist

        self._dist = dist
        self._lock = threading.Lock()
        self._released = False
        self.owned = False  # False: the script had initialised one itself
        self._mine: set[Socket] = set()
        if dist.is_initialized():
            return
        if "MASTER_ADDR" not in os.environ:  # plain python: no group, as the script chose
            return
        group_registry.track()  # the sub-groups' sockets too, from here on
        group_registry.begin()
        before = process_sockets()
        kwargs: dict[str, Any] = {}
        if members is not None:
            kwargs.update(store=members[0], rank=members[1], world_size=members[2])
        if timeout_s is not None:
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, **kwargs)
        self._mine = process_sockets() - before
        self.owned = True

    def release(self) -> int:
        """Make every collective of the generation's groups (the world's and every group
        opened since) fail now (from any thread; once); how many connections were shut
        down."""
        with self._lock:
            if self._released or not self.owned:
                return 0
            self._released = True
        for group in group_registry.open_groups():
            with contextlib.suppress(Exception):
                if self._dist.get_backend(group) != "gloo":
                    group.abort()
        return shut_all(self._mine | group_registry.release())

    def close(self) -> None:
        """Destroy the group (after release() its calls return at once)."""
        if self.owned and self._dist.is_initialized():
            with contextlib.suppress(Exception):
                self._dist.destroy_process_group()
        self.owned = False
