"""Every process group a worker opens in one generation, sub-groups included, so that a
repair releases them all (core/worker/repair/group.py), not only the world group.

Sockets (gloo). torch.distributed opens each gloo group through one function,
distributed_c10d._new_process_group_helper: init_process_group's world group,
new_group's, new_subgroups' and the sub-groups init_device_mesh makes for a 2-D mesh
(HSDP) all pass there, and gloo connects the group's ranks inside the call (eagerly:
unless TORCH_GLOO_LAZY_INIT=1, when they connect at the first collective, unseen here).
Wrapping it records the sockets that appeared during each call, the group's own; a
socket the script opens before or after (wandb, HTTP, a data loader's) is never among
them. The one socket that can be counted wrongly is one another thread opens during
that very call, as a group is created. A group created after the release (a survivor
inside init_device_mesh when its peer died) has its connections shut down as soon as
it is made, so its first collective fails too. Other ways were weighed: a group's
listening socket names the connections its peers made to it (their local port), not
the ones this process made to its peers, and a listener of the script's (a metrics
server) looks the same; gloo's ProcessGroup has no accessor for its connections.

Groups (NCCL). torch's registry of groups (_world.pg_map) lists them all, split_group's
too, for the backends with an abort of their own.

Both are torch's private API, named in this module only. CHECKED_ON is the torch
release they were read on; tests/unit/core/test_repair_group.py fails there if either
is renamed or gone. On a release without them, tracked() is False and a repair
releases the world group only, as before.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from .group_sockets import Socket, process_sockets, shut_all

CHECKED_ON = (2, 13)  # the torch release (major, minor) whose private API this reads
HELPER = "_new_process_group_helper"
MARK = "__rtrain_group_sockets__"


class _Opened:
    """The sockets of the groups opened since begin(), and whether they were released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sockets: set[Socket] = set()
        self.released = False


_OPENED = _Opened()  # one per process, as torch.distributed's state is


def _c10d() -> Any:
    import torch.distributed.distributed_c10d as c10d

    return c10d


def _record(opened: set[Socket]) -> None:
    """Count `opened` as the generation's; shut them down at once if it was released."""
    with _OPENED.lock:
        _OPENED.sockets |= opened
        late = _OPENED.released
    if late:
        shut_all(opened)


def _wrap(helper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(helper)
    def create(*args: Any, **kwargs: Any) -> Any:
        before = process_sockets()
        try:
            return helper(*args, **kwargs)
        finally:
            _record(process_sockets() - before)

    setattr(create, MARK, True)
    return create


def track() -> bool:
    """Record the sockets of every group opened from now on (once per process; from
    the thread that opens groups); whether this torch allows it."""
    c10d = _c10d()
    helper = getattr(c10d, HELPER, None)
    if not callable(helper):
        return False
    if not getattr(helper, MARK, False):
        setattr(c10d, HELPER, _wrap(helper))
    return True


def tracked() -> bool:
    """Whether the groups' creation is recorded in this process."""
    return bool(getattr(getattr(_c10d(), HELPER, None), MARK, False))


def begin() -> None:
    """A new generation: forget the old groups' sockets (closed with them)."""
    with _OPENED.lock:
        _OPENED.sockets = set()
        _OPENED.released = False


def release() -> set[Socket]:
    """The sockets of the groups opened since begin(); a group opened from now on has
    its connections shut down as it is made."""
    with _OPENED.lock:
        _OPENED.released = True
        return set(_OPENED.sockets)


def open_groups() -> list[Any]:
    """Every process group torch holds in this process (empty if its registry is gone)."""
    found = getattr(getattr(_c10d(), "_world", None), "pg_map", None)
    return list(found) if isinstance(found, dict) else []
