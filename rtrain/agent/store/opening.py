"""Opening torch's TCPStore for the rendezvous and for each generation's workers.

TCPStore's client can block past its own timeout when something other than a
TCPStore listens on the port, so every connect here runs under a hard deadline.

TCPStore's server listens on every interface whatever host it is given; a store
hosted here listens on the job address only: rtrain binds the socket itself and hands
it over (TCPStore's public master_listen_fd), unless the address is a name that
resolves to loopback (a Debian /etc/hosts quirk: peers reach the node elsewhere).

A node waits for the job's store as long as join_timeout allows (torchrun's rule),
whether nothing listens there yet or the port is taken by a store that does not answer
yet (its host still importing torch on a loaded machine), with a line every
WAIT_LINE_S saying on what it waits; no shorter window (issue 31: the second node of
a localhost job gave up after a fixed 10 s while node 0 was still starting). Each
connect attempt gets ATTEMPT_S and the next resolves the name again: a store host's
pod replaced under the same name (Kubernetes) answers at a new address.

Only the host imports torch (its server is torch's): a node that connects uses
TCPStoreClient (tcpstore_client.py), torch's wire protocol without torch, for a torch
it was written against (issue 36: 64 agents each importing torch to reach the store
took 85 s to start on 2 cores, 35 s over etcd).
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.clock import Clock
from ...core.errors import RendezvousError, first_line
from ..waiting import SYSTEM_CLOCK
from .store_host import choose_store_host, endpoint_owner, resolve
from .tcpstore_client import TCPStoreClient
from .tcpstore_wire import StoreUnreachable, torch_version_supported

logger = logging.getLogger(__name__)

WAIT_LINE_S = 10.0  # a line this often while the store has not answered
JOIN_SLICE_S = 0.25  # how often a wait for the store looks for a signal
ATTEMPT_S = 15.0  # one connect's window; the next resolves the store's name again
RETRY_PAUSE_S = 0.5  # after an attempt that failed at once


@dataclass
class OpenedStore:
    store: Any  # torch.distributed.TCPStore
    host: str
    port: int
    is_host: bool


def endpoint_is_local(host: str, local_addr: str | None) -> bool:
    """Whether this node owns the endpoint (torch's rule: agent/store/store_host.py)."""
    return endpoint_owner(host, local_addr).hosts is True


def _tcp_store(**kwargs: Any) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(**kwargs)


def _client(
    host: str, port: int, window: float, on_refused: Callable[[], None] | None = None
) -> Any:
    """A client connection, without torch where the wire client knows this torch
    (on_refused: called at each refused connection; torch's client does not say)."""
    if torch_version_supported():
        return TCPStoreClient.connect(host, port, window, on_refused)
    timeout = datetime.timedelta(seconds=window)
    return _tcp_store(host_name=host, port=port, is_master=False, timeout=timeout)


def port_taken(port: int) -> bool:
    """Whether a socket on this machine listens on `port`: a bind to every interface
    fails with EADDRINUSE (SO_REUSEADDR lets one through a port left in TIME_WAIT).
    Asked after TCPStore failed to start, so that its error need not be read as text."""
    if port == 0:
        return False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
        finally:
            probe.close()
    return False


def listening_socket(host: str, port: int) -> socket.socket | None:
    """A socket listening on host:port only, or None where binding to every interface is
    the right thing (a wildcard, or a name that resolves to loopback). Raises
    OSError(EADDRINUSE) if the port is taken."""
    if host in ("", "0.0.0.0", "::"):
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None  # TCPStore reports the bad name
    family, _, _, _, address = infos[0]
    literal = _is_ip_literal(host)
    if not literal and str(address[0]).startswith("127."):
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(errno.EADDRINUSE, f"port {port} is in use") from None
        return None  # not an address of this machine: let TCPStore listen everywhere
    return sock


def listens_beyond_loopback(host: str, etcd: bool) -> bool:
    """Whether the job's store can be reached from another machine. Only a TCPStore on
    a loopback address literal cannot: it is bound to that address alone. A name (even
    one that resolves to loopback) is listened on as above, and etcd listens wherever
    its operator put it."""
    if etcd:
        return True
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_store(host: str, port: int, timeout_s: float) -> OpenedStore:
    """Start a TCPStore server on this node, listening on `host` (see the module's note).
    Raises OSError(EADDRINUSE) if the port is taken."""
    import torch.distributed  # noqa: F401 - first: the port listens only once it can answer

    sock = listening_socket(host, port)
    bound: dict[str, Any] = {"port": port}
    if sock is not None:
        bound = {"port": sock.getsockname()[1], "master_listen_fd": sock.detach()}
    # The server's own client connects to host_name: a name whose record is not out yet
    # (a pod's headless-service record comes after the pod) would keep the host waiting
    # on itself; it listens on every interface then (listening_socket gave None).
    own = host if sock is not None or resolve(host) else "127.0.0.1"
    try:
        store = _tcp_store(
            host_name=own,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            **bound,
        )
    except Exception as exc:
        if "master_listen_fd" in bound:
            os.close(bound["master_listen_fd"])  # torch raises DistNetworkError (a RuntimeError)
        if port_taken(port):
            raise OSError(98, f"port {port} is in use") from None
        raise RendezvousError(
            f"cannot start the store on {host}:{port}: {first_line(exc)}"
        ) from None
    return OpenedStore(store=store, host=host, port=store.port, is_host=True)


def connect_store(
    host: str,
    port: int,
    deadline_s: float,
    timeout_s: float,
    interrupt: Callable[[], None] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> OpenedStore:
    """Connect as a client, giving up after deadline_s whatever TCPStore itself does; a
    line every WAIT_LINE_S while nothing answers; interrupt() (it raises on a signal) is
    called every JOIN_SLICE_S meanwhile. Each attempt gets at most ATTEMPT_S and resolves
    the name again: TCPStore's client keeps the address it resolved first, and a store
    host's pod replaced under the same name answers at a new one. clock: the wait's
    deadlines, lines and pauses (an attempt itself blocks in real time)."""
    wait = _Wait(f"the rendezvous store at {host}:{port}", deadline_s, clock)
    while True:
        window = max(min(ATTEMPT_S, wait.left()), 0.1)
        result = _attempt(host, port, window, wait, interrupt)
        if "store" in result:
            store = result["store"]
            store.set_timeout(datetime.timedelta(seconds=timeout_s))
            return OpenedStore(store=store, host=host, port=port, is_host=False)
        if wait.left() <= 0:
            break
        if "error" in result:  # refused at once (a name not resolving yet): not a hot loop
            clock.sleep(min(RETRY_PAUSE_S, max(wait.left(), 0.0)))
            if interrupt is not None:
                interrupt()
    if "error" in result:
        error = result["error"]
        # the last attempt's own deadline is not the wait's: its reason alone, not nested
        reason = error.reason if isinstance(error, StoreUnreachable) else first_line(error)
        raise RendezvousError(
            f"cannot reach the rendezvous store at {host}:{port} within {deadline_s:g}s: {reason}"
        )
    raise RendezvousError(
        f"no rendezvous store answered at {host}:{port} within {deadline_s:g}s "
        "(is another program listening on that port?)"
    )


def _attempt(
    host: str, port: int, window: float, wait: _Wait, interrupt: Callable[[], None] | None
) -> dict[str, Any]:
    """One connect under TCPStore's own timeout of window, joined for up to window + 2 s
    (never past the whole wait's end + 2 s): {"store": ...}, {"error": ...} or {}."""
    result: dict[str, Any] = {}

    def attempt() -> None:
        try:
            result["store"] = _client(host, port, window, wait.refused)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=attempt, name="rtrain-store-connect", daemon=True)
    thread.start()
    end = min(wait.clock.now() + window, wait.end) + 2.0
    while thread.is_alive():
        now = wait.clock.now()
        if now >= end:
            break
        wait.say(now)
        thread.join(min(JOIN_SLICE_S, end - now))  # a real thread: its join is the pause
        if interrupt is not None:
            interrupt()
    return dict(result)


class _Wait:
    """The whole wait for a store: its end, and a line every WAIT_LINE_S on what it waits."""

    def __init__(self, what: str, deadline_s: float, clock: Clock) -> None:
        self.what, self.deadline_s, self.clock = what, deadline_s, clock
        self.started = clock.now()
        self.end = self.started + deadline_s
        self.next_line = self.started + WAIT_LINE_S
        self.refused_at: float | None = None  # the last refused connection (the wire client)

    def refused(self) -> None:
        self.refused_at = self.clock.now()

    def left(self) -> float:
        return self.end - self.clock.now()

    def say(self, now: float) -> None:
        if now < self.next_line:
            return
        self.next_line += WAIT_LINE_S
        refused = self.refused_at is not None and now - self.refused_at < WAIT_LINE_S
        logger.info(
            "waiting for %s: %s for %.0fs, waiting up to %gs (join_timeout); "
            "its host may still be starting",
            self.what,
            "connection refused (nothing listens on that port yet)" if refused else "no answer",
            now - self.started,
            self.deadline_s,
        )


def open_rendezvous_store(
    host: str,
    port: int,
    is_host: bool | None,
    local_addr: str | None,
    join_timeout: float,
    read_timeout: float,
    interrupt: Callable[[], None] | None = None,
    backend: str = "c10d",
    node_rank: int | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> OpenedStore:
    """Host the store if this node is the one to (agent/store/store_host.py says which
    and why, in one line), else (or if already hosted here) connect, waiting for it up
    to join_timeout (on `clock`)."""
    choice = choose_store_host(host, backend, is_host, node_rank, local_addr)
    logger.info("%s", choice.line(f"{host}:{port}"))
    if choice.hosts is not False:
        try:
            opened = host_store(host, port, read_timeout)
            logger.info("hosting the rendezvous store on %s:%d", host, opened.port)
            return opened
        except OSError:
            if choice.hosts:
                raise RendezvousError(
                    f"cannot host the rendezvous store: port {port} on {host} is in use"
                ) from None
            # Another agent on this machine hosts it (tests, several agents per host); it
            # may still be starting, so it gets join_timeout like a store on another host.
            logger.info("port %d is taken; joining as a client", port)
    return connect_store(host, port, join_timeout, read_timeout, interrupt, clock)
