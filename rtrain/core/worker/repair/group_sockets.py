"""A process's sockets, listed and shut down one by one: how a process group's
connections are told apart from every other socket of the worker (the sockets that
appeared while the group was being opened) and how they are made to fail at once.

A socket is named by (descriptor, 'socket:[inode]'): a descriptor whose socket changed
since it was listed (closed, its number reused by another socket, a user's) is
skipped, so a stale entry never shuts down a socket that is not the group's.
"""

from __future__ import annotations

import os
import socket

SOCKET_FOLDER = "/proc/self/fd"

Socket = tuple[int, str]  # (descriptor, 'socket:[inode]')


def process_sockets() -> set[Socket]:
    """This process's sockets now; empty without /proc."""
    found: set[Socket] = set()
    try:
        names = os.listdir(SOCKET_FOLDER)
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(os.path.join(SOCKET_FOLDER, name))
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add((int(name), link))
    return found


def shut(fd: int, link: str) -> bool:
    """Shut down (shutdown(2), not close: the descriptor stays the group's) the
    connected TCP socket at `fd` if it is still the one seen as `link`; whether it did.
    Listening sockets are left alone: gloo's listener thread aborts the process on an
    error there."""
    try:
        copy = os.dup(fd)
    except OSError:
        return False
    try:
        if os.readlink(os.path.join(SOCKET_FOLDER, str(copy))) != link:
            os.close(copy)
            return False
        sock = socket.socket(fileno=copy)  # owns `copy` from here
    except OSError:
        os.close(copy)
        return False
    with sock:
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return False
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return False
            sock.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False


def shut_all(sockets: set[Socket]) -> int:
    """Shut down each of `sockets` still open as listed; how many were."""
    return sum(shut(fd, link) for fd, link in sorted(sockets))
