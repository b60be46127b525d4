"""Which etcd member a node's clients use: the first by the node's address, and all of
them moving off a member that failed at once (see client.py's note)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import zlib
from collections.abc import Callable


def first_member(local_addr: str | None, members: int) -> int:
    """The member a node tries first: its IP address modulo the members (consecutive
    addresses start on different members), or a hash of its name."""
    name = local_addr or socket.gethostname()
    try:
        number = int(ipaddress.ip_address(name))
    except ValueError:
        number = zlib.crc32(name.encode())
    return number % members


class Members:
    """The member a client and its copies use now, and the watches to move off a member
    that failed (each registered as a callback that closes its stream)."""

    def __init__(self, count: int, start: int = 0) -> None:
        self.count = count
        self.current = start % count
        self._lock = threading.Lock()
        self._watching: dict[int, set[Callable[[], None]]] = {}

    def leave(self, index: int) -> None:
        """index failed a request: every client moves on (once, if several saw it)."""
        with self._lock:
            if self.current != index:
                return  # left already (a watch registers only on the current member)
            self.current = (index + 1) % self.count
            kicks = list(self._watching.get(index, ()))
        for kick in kicks:
            kick()

    def watch(self, index: int, kick: Callable[[], None]) -> bool:
        """Register a watch's stream on index; False if index was left meanwhile."""
        with self._lock:
            self._watching.setdefault(index, set()).add(kick)
            return self.current == index

    def unwatch(self, index: int, kick: Callable[[], None]) -> None:
        with self._lock:
            self._watching.get(index, set()).discard(kick)
