"""The replicator's wake FIFO across generations (agent/snapshots/replication/wake_fifo.py): a new
generation's follow() must not close the descriptor the replicating thread is about to
select on and read. Closed there, its number went to the next socket the agent opened
(the new generation's worker store accepting a worker: the lowest free number), and the
thread read that worker's store request off it. Seen as a worker of a restarted
generation waiting forever in init_process_group for an answer its store never got
(with torch's libuv and classic servers alike), about one loaded run of the fault
tests in five.

Here the thread is held just before its select, holding the old number; follow() moves
on to a generation whose FIFO cannot be opened (so nothing else takes the number back),
and a socket pair is opened with bytes waiting. The bytes must still be there after the
thread's select and read."""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from rtrain.agent.snapshots.peers.transport import TcpTransport
from rtrain.agent.snapshots.replication import wake_fifo
from rtrain.agent.snapshots.replication.replicator import Replicator
from rtrain.agent.snapshots.shard_store import ShardStore
from rtrain.core.snapshots.format import WAKE_FIFO

SECRET = b"0123456789abcdef0123456789abcdef"
REQUEST = b"a store request"


class HeldSelect:
    """select.select for the replicating thread, held on its next call until released."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fds: list[int] = []

    def __call__(self, readable: list[int], *rest: Any) -> Any:
        if threading.current_thread().name == "rtrain-replicate" and self.armed.is_set():
            self.armed.clear()
            self.fds = list(readable)
            self.entered.set()
            assert self.release.wait(30)
        return self.real(readable, *rest)


def test_a_new_generation_never_hands_the_threads_wake_number_to_a_socket(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldSelect(select.select)
    monkeypatch.setattr(wake_fifo.select, "select", held)
    store = ShardStore(str(tmp_path), budget=0)
    # generation 1's FIFO cannot be opened (a folder in its place): nothing in follow()
    # takes a freed number back, as the worker store's accept took it in the agent
    os.mkdir(os.path.join(store.snap_dir(1), WAKE_FIFO))
    passes = threading.Semaphore(0)
    listener = SimpleNamespace(committed=lambda rank, step: None, between_passes=passes.release)
    replicator = Replicator(store, TcpTransport(SECRET), listener)
    ours = theirs = None
    try:
        replicator.follow(0, [], world_size=1, local_ranks=1)
        held.armed.set()
        assert held.entered.wait(30), "the replicating thread never selected"
        (stale,) = held.fds  # generation 0's FIFO, as the thread holds it
        replicator.follow(1, [], world_size=1, local_ranks=1)
        ours, theirs = socket.socketpair()
        theirs.sendall(REQUEST)
        while passes.acquire(blocking=False):
            pass
        held.release.set()
        # the thread's select on `stale` ends (a FIFO byte, the request, or its pause),
        # it reads what it found, and its next pass comes round
        assert passes.acquire(timeout=30), "the replicating thread stopped"
        ours.setblocking(False)
        try:
            waiting = ours.recv(64)
        except BlockingIOError:
            waiting = b""
        assert waiting == REQUEST, (
            f"the socket took number {ours.fileno()} (the thread's was {stale}), "
            "and the thread read its bytes"
        )
    finally:
        held.release.set()
        replicator.close()
        for end in (ours, theirs):
            if end is not None:
                end.close()
