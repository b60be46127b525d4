"""The simulated agents' blocking waits on TCPStore, served by one thread per shard.

A real agent's KeyNotices (agent/store/torch_notices.py) blocks a thread of its own in
TCPStore.wait on a connection of its own, then confirms the key with a check (torch's
server also wakes waiters on a compare-set that writes nothing) and waits again if it
is not set. 2,048 simulated agents were 2,048 such threads, all woken at once when a
generation's news or a round's closed key was set: the simulator's own herd. Here each
agent keeps its own connection and sends the same requests (WAIT, then CHECK), in the
same order, so the store serves what 2,048 agents ask of it; one selector thread per
shard reads the answers. A check answers as KeyNotices.check does: from the waits when
the connection waits on that key, else from the caller's own read.

TCPStore's wire protocol is torch's private interface; agent/store/tcpstore_wire.py
holds what rtrain knows of it (its tests run it against torch's server), and this
reuses its connection and handshake, adding the one query it does not send (WAIT).
"""

from __future__ import annotations

import selectors
import struct
import threading
from collections.abc import Callable

from sim_counting import Requests

from rtrain.agent.store.tcpstore_wire import TCPStoreReader, _key, _string

WAIT = 6  # c10d's QueryType::WAIT; the answer is one byte, STOP_WAITING (0)
STOP_WAITING = 0
REMEMBERED = 64


class WaitMux:
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()  # epoll: registered from any thread
        threading.Thread(target=self._run, name="sim-waits", daemon=True).start()

    def notices(self, host: str, port: int, requests: Requests) -> MuxNotices:
        """A connection of the agent's own, opened now, its answers read by this mux."""
        reader = TCPStoreReader.connect(host, port, 60.0)
        notices = MuxNotices(reader, requests)
        self._selector.register(reader._sock, selectors.EVENT_READ, notices)
        return notices

    def _run(self) -> None:
        while True:
            for handle, _events in self._selector.select(timeout=1.0):
                notices: MuxNotices = handle.data
                if not notices.answered():
                    self._selector.unregister(handle.fileobj)


class MuxNotices:
    """KeyNotices' interface (check, waiting_on) over one connection."""

    def __init__(self, reader: TCPStoreReader, requests: Requests) -> None:
        self._reader = reader
        self._requests = requests
        self._lock = threading.Lock()
        self._waiting_on: str | None = None
        self._wanted: str | None = None
        self._seen: dict[str, None] = {}
        self._broken = False
        self.spurious_wakeups = 0

    @property
    def waiting_on(self) -> str | None:
        with self._lock:
            return self._waiting_on

    def check(self, key: str, read: Callable[[], bool]) -> bool:
        with self._lock:
            if key in self._seen:
                return True
            if not self._broken and self._waiting_on == key:
                return False
            if not self._broken:
                self._wanted = key
                if self._waiting_on is None:
                    self._send_wait(key)
        if read():
            self._remember(key)
            return True
        return False

    def _send_wait(self, key: str) -> None:
        """Under the lock, with no wait outstanding."""
        try:
            self._reader._sock.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + _string(_key(key)))
        except OSError:
            self._broken = True
            return
        self._requests.add("wait", len(key))
        self._waiting_on = key

    def _remember(self, key: str) -> None:
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > REMEMBERED:
                del self._seen[next(iter(self._seen))]

    def answered(self) -> bool:
        """The mux thread: this connection's wait returned (or the connection ended:
        False, it is read no more)."""
        try:
            answer = self._reader._sock.recv(1)
            key = self._waiting_on
            if answer != bytes([STOP_WAITING]) or key is None:
                raise OSError("the wait ended without STOP_WAITING")
            self._requests.add("check", len(key), 1)
            confirmed = self._reader._check([key])
        except Exception:  # the agent's own reads find a lost store and say so
            with self._lock:
                self._broken, self._waiting_on = True, None
            return False
        with self._lock:
            if confirmed:
                self._seen[key] = None
            else:
                self.spurious_wakeups += 1
            self._waiting_on = None
            wanted = self._wanted
            if wanted is not None and wanted not in self._seen:
                self._send_wait(wanted)
        return True
