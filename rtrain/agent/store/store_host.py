"""Which node hosts the job's TCPStore, and why (one line says it).

- is_host in --rdzv-conf: that, whatever the names.
- The static rendezvous: node rank 0, whatever the names (torch's static rendezvous).
- c10d: the node that owns the endpoint, by torch's rule: the endpoint is "localhost"
  or a loopback address, or this machine's host name, or it resolves to an address of
  this machine, one of its interfaces' (on Kubernetes the pod's address, which the
  kubelet's /etc/hosts line and the headless service's DNS record both give; the
  hostname alone, `tj-node-0-0`, never equals the endpoint's `tj-node-0-0.tj`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


@dataclass(frozen=True)
class HostChoice:
    # True: host the store; False: connect to it; None: host it unless its port is
    # taken on this machine (another agent here hosts it), then connect.
    hosts: bool | None
    reason: str

    def line(self, endpoint: str) -> str:
        verb = "hosts" if self.hosts is not False else "does not host"
        return f"this node {verb} the rendezvous store {endpoint}: {self.reason}"


def interface_addresses() -> set[str] | None:
    """This machine's interface addresses (psutil), or None where they cannot be read."""
    import psutil

    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, RuntimeError, psutil.Error):
        return None
    families = (socket.AF_INET, socket.AF_INET6)
    return {
        str(entry.address).split("%", 1)[0]
        for entries in interfaces.values()
        for entry in entries
        if entry.family in families
    }


def owns_address(address: str, mine: set[str] | None = None) -> bool:
    """Whether `address` is one of this machine's: loopback, or an interface's address
    (where those cannot be read: whether a socket binds to it)."""
    bare = address.split("%", 1)[0]
    try:
        parsed = ipaddress.ip_address(bare)
    except ValueError:
        return False
    if parsed.is_loopback or parsed.is_unspecified:
        return True
    if mine is not None:
        return str(parsed) in mine or bare in mine
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    try:
        probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return False
    with probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def resolve(host: str) -> list[str]:
    """Every address `host` resolves to (empty if it does not, yet)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    return found


def machine_names(local_addr: str | None) -> set[str]:
    names = set(LOCAL_NAMES)
    for name in (socket.gethostname(), socket.getfqdn(), local_addr):
        if name:
            names.add(name)
    return names


def endpoint_owner(host: str, local_addr: str | None) -> HostChoice:
    """torch's rule for c10d (see the module's note), with the reason."""
    if host in machine_names(local_addr):
        return HostChoice(True, f"{host} names this machine")
    addresses = resolve(host)
    if not addresses:
        return HostChoice(False, f"{host} does not resolve here; another node hosts it")
    interfaces = interface_addresses()
    mine = [a for a in addresses if owns_address(a, interfaces)]
    if mine:
        kind = "loopback" if all(_loopback(a) for a in mine) else "an address of this machine"
        return HostChoice(True, f"{host} resolves to {mine[0]}, {kind}")
    return HostChoice(
        False, f"{host} resolves to {', '.join(addresses)}, not an address of this machine"
    )


def choose_store_host(
    host: str, backend: str, is_host: bool | None, node_rank: int | None, local_addr: str | None
) -> HostChoice:
    if is_host is not None:
        return HostChoice(is_host, f"is_host={int(is_host)} in --rdzv-conf")
    if backend == "static" and node_rank is not None:
        if node_rank == 0:
            return HostChoice(True, "the static rendezvous hosts it on node rank 0")
        return HostChoice(
            False, f"the static rendezvous hosts it on node rank 0 (this is {node_rank})"
        )
    choice = endpoint_owner(host, local_addr)
    if choice.hosts:  # several agents on one machine: the first to bind it hosts
        return HostChoice(None, choice.reason)
    return choice


def _loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    return False
