"""Rendezvous backends and their store endpoints: HOST, HOST:PORT, an IPv6 address,
[IPv6]:PORT, and lists of them (an etcd cluster's members). Each parser raises
UsageError naming --rdzv-endpoint. Pure."""

from __future__ import annotations

import ipaddress
import re

from ..errors import UsageError
from .flag_values import ascii_int

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
# torchrun's two etcd backends are one here: both talk etcd's v3 API (v2 is gone from
# etcd 3.6), through agent/store/etcd/client.py.
ETCD_BACKENDS = ("etcd", "etcd-v2")
DEFAULT_C10D_PORT = 29400
DEFAULT_ETCD_PORT = 2379
DEFAULT_MASTER_PORT = 29500
MAX_ENDPOINTS = 64
_HOST = re.compile(r"[A-Za-z0-9_.\-]{1,253}")
FLAG = "--rdzv-endpoint"

# A host and its port; None: the port was not written (the backend's default applies).
Endpoint = tuple[str, int | None]


def split_endpoint(value: str) -> Endpoint:
    """HOST, HOST:PORT, an IPv6 address, or [IPv6]:PORT; the port None when absent."""
    text = str(value).strip()
    if not text:
        raise UsageError(f"{FLAG}: empty endpoint")
    if text.startswith("["):  # [ipv6]:port
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")) or not _is_ipv6(host):
            raise UsageError(f"{FLAG}: expected [IPv6]:PORT, got {value!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        if not _is_ipv6(text):
            raise UsageError(
                f"{FLAG}: too many ':' in {value!r} (write an IPv6 address as [ADDRESS]:PORT)"
            )
        host, port_text = text, None
    else:
        host, sep, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if sep else None
        if not host:
            raise UsageError(f"{FLAG}: missing host in {value!r}")
        if not _HOST.fullmatch(host):
            raise UsageError(f"{FLAG}: {host!r} is not a host name or address")
    if port_text is None:
        return host, None
    port = ascii_int(port_text)
    if port is None or not 0 <= port < 65536:
        raise UsageError(f"{FLAG}: port must be 0-65535, got {value!r}")
    return host, port


def parse_endpoint(value: str, default_port: int) -> tuple[str, int]:
    """One endpoint, default_port where none is written."""
    host, port = split_endpoint(value)
    return host, default_port if port is None else port


def split_endpoints(value: str) -> tuple[Endpoint, ...]:
    """HOST[:PORT],HOST[:PORT],...: () for an empty value, blank items skipped."""
    text = str(value).strip()
    if not text:
        return ()
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError(f"{FLAG}: empty endpoint")
    if len(items) > MAX_ENDPOINTS:
        raise UsageError(f"{FLAG}: more than {MAX_ENDPOINTS} endpoints")
    return tuple(split_endpoint(item) for item in items)


def with_ports(endpoints: tuple[Endpoint, ...], default_port: int) -> tuple[tuple[str, int], ...]:
    """An etcd cluster's members, default_port where none is written; port 0 refused."""
    filled = tuple((host, default_port if port is None else port) for host, port in endpoints)
    if any(port == 0 for _, port in filled):
        raise UsageError(f"{FLAG}: an etcd endpoint needs a real port, not 0")
    return filled


def parse_endpoints(value: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """HOST[:PORT],HOST[:PORT],... (an etcd cluster's members)."""
    endpoints = split_endpoints(value)
    if not endpoints:
        raise UsageError(f"{FLAG}: empty endpoint")
    return with_ports(endpoints, default_port)


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False
