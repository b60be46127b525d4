"""Parsers for the values of torchrun's flags: each turns one raw string into a typed
value or raises UsageError naming the flag. Pure: no processes, no I/O."""

from __future__ import annotations

import ipaddress
import math
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
# --rdzv-conf keys with torchrun's defaults (seconds).
RDZV_CONF_DEFAULTS: dict[str, float] = {
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "close_timeout": 30.0,
    "heartbeat_timeout": 5.0,
    "read_timeout": 60.0,
}
RDZV_CONF_FLAGS = ("is_host",)
# Bounds past which a value is a typo, not a configuration: they keep absurd numbers
# from turning into sleeps that never end, overflows or a launcher forking for ever.
MAX_SECONDS = 7 * 24 * 3600.0
MAX_COUNT = 1 << 31
MAX_NODES = 65536
MAX_NPROC = 1024
MAX_ENDPOINTS = 64
MAX_SIZE = 1 << 60
_INT = re.compile(r"\+?[0-9]{1,19}")  # ASCII digits only (str.isdigit() takes "²", "١")
_SIZE = re.compile(r"[0-9]{1,19}(\.[0-9]{1,9})?")
_HOST = re.compile(r"[A-Za-z0-9_.\-]{1,253}")
RDZV_CONF_STRINGS = ("store_type", "protocol", "cacert", "cert", "key")
# torchrun's etcd backends call the join timeout "timeout".
RDZV_CONF_ALIASES = {"timeout": "join_timeout"}
ETCD_PROTOCOLS = ("http", "https")


@dataclass(frozen=True)
class NodeRange:
    min_nodes: int
    max_nodes: int

    @property
    def is_elastic(self) -> bool:
        return self.min_nodes != self.max_nodes


@dataclass(frozen=True)
class StreamMap:
    """Which std streams (1 stdout, 2 stderr, 3 both) go to files, per local rank."""

    default: int = 0
    per_rank: Mapping[int, int] = field(default_factory=dict)

    def mask(self, local_rank: int) -> int:
        return self.per_rank.get(local_rank, self.default)


def ascii_int(value: Any) -> int | None:
    """An integer written in ASCII digits (or an int), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    return int(text) if _INT.fullmatch(text) else None


def parse_nnodes(value: str) -> NodeRange:
    text = str(value).strip()
    parts = text.split(":")
    numbers = [ascii_int(p) for p in parts]
    if len(parts) not in (1, 2) or any(n is None for n in numbers):
        raise UsageError(f"--nnodes: expected N or MIN:MAX with positive integers, got {value!r}")
    lo, hi = (numbers[0] or 0, numbers[-1] or 0)
    if hi > MAX_NODES:
        raise UsageError(f"--nnodes: at most {MAX_NODES} nodes, got {value!r}")
    if lo < 1:
        raise UsageError(f"--nnodes: the node count must be at least 1, got {value!r}")
    if lo > hi:
        raise UsageError(f"--nnodes: MIN must not exceed MAX, got {value!r}")
    return NodeRange(lo, hi)


def validate_nproc(value: str) -> str:
    text = str(value).strip()
    if text in NPROC_KEYWORDS:
        return text
    number = ascii_int(text)
    if number is None or not 1 <= number <= MAX_NPROC:
        raise UsageError(
            f"--nproc-per-node: expected an integer 1-{MAX_NPROC} or one of "
            f"{', '.join(NPROC_KEYWORDS)}, got {value!r}"
        )
    return str(number)


def resolve_nproc(value: str, gpu_count: int, cpu_count: int) -> int:
    """Turn --nproc-per-node into a process count the way torchrun does."""
    if value.isdigit():
        return int(value)
    if value == "cpu":
        return max(cpu_count, 1)
    if value == "auto":
        return gpu_count if gpu_count > 0 else max(cpu_count, 1)
    if value == "gpu":
        if gpu_count < 1:
            raise UsageError("--nproc-per-node=gpu: this node has no visible GPU")
        return gpu_count
    raise UsageError(f"--nproc-per-node={value}: rtrain cannot count {value} devices")


def parse_stream_map(flag: str, value: str) -> StreamMap:
    text = str(value).strip()
    whole = ascii_int(text)
    if whole is not None:
        _check_mask(flag, whole, value)
        return StreamMap(default=whole)
    per_rank: dict[int, int] = {}
    for item in text.split(","):
        rank_text, sep, mask_text = item.partition(":")
        rank, mask = ascii_int(rank_text), ascii_int(mask_text)
        if not sep or rank is None or mask is None or rank > MAX_NPROC:
            raise UsageError(f"{flag}: expected 0-3 or LOCAL_RANK:MASK,..., got {value!r}")
        _check_mask(flag, mask, value)
        per_rank[rank] = mask
    return StreamMap(default=0, per_rank=per_rank)


def _check_mask(flag: str, mask: int, value: str) -> None:
    if mask not in (0, 1, 2, 3):
        raise UsageError(f"{flag}: stream mask must be 0, 1, 2 or 3, got {value!r}")


def parse_endpoint(value: str, default_port: int) -> tuple[str, int]:
    """HOST, HOST:PORT, an IPv6 address, or [IPv6]:PORT."""
    text = str(value).strip()
    if not text:
        raise UsageError("--rdzv-endpoint: empty endpoint")
    if text.startswith("["):  # [ipv6]:port
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")) or not _is_ipv6(host):
            raise UsageError(f"--rdzv-endpoint: expected [IPv6]:PORT, got {value!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        if not _is_ipv6(text):
            raise UsageError(
                f"--rdzv-endpoint: too many ':' in {value!r} (write an IPv6 address as "
                "[ADDRESS]:PORT)"
            )
        host, port_text = text, None
    else:
        host, sep, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if sep else None
        if not host:
            raise UsageError(f"--rdzv-endpoint: missing host in {value!r}")
        if not _HOST.fullmatch(host):
            raise UsageError(f"--rdzv-endpoint: {host!r} is not a host name or address")
    if port_text is None:
        return host, default_port
    port = ascii_int(port_text)
    if port is None or not 0 <= port < 65536:
        raise UsageError(f"--rdzv-endpoint: port must be 0-65535, got {value!r}")
    return host, port


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def seconds_value(flag: str, raw: Any) -> float:
    """A positive, finite number of seconds within MAX_SECONDS."""
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected a positive number of seconds, got {raw!r}") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise UsageError(
            f"{flag}: expected a positive number of seconds, at most {MAX_SECONDS:g}, got {raw!r}"
        )
    return seconds


def parse_rdzv_conf(value: str) -> dict[str, Any]:
    conf: dict[str, Any] = dict(RDZV_CONF_DEFAULTS)
    conf["is_host"] = None
    text = str(value).strip()
    if not text:
        return conf
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        raw = raw.strip()
        if not sep or not key:
            raise UsageError(f"--rdzv-conf: expected key=value pairs, got {item!r}")
        key = RDZV_CONF_ALIASES.get(key, key)
        if key in RDZV_CONF_DEFAULTS:
            conf[key] = seconds_value(f"--rdzv-conf {key}", raw)
        elif key in RDZV_CONF_FLAGS:
            conf[key] = _parse_bool(f"--rdzv-conf {key}", raw)
        elif key in RDZV_CONF_STRINGS:
            if not raw:
                raise UsageError(f"--rdzv-conf {key}: empty value")
            conf[key] = raw
        else:
            known = ", ".join(
                [*RDZV_CONF_DEFAULTS, *RDZV_CONF_FLAGS, *RDZV_CONF_STRINGS, *RDZV_CONF_ALIASES]
            )
            raise UsageError(f"--rdzv-conf: unknown key {key!r} (known: {known})")
    protocol = conf.get("protocol", "http")
    if protocol not in ETCD_PROTOCOLS:
        raise UsageError(f"--rdzv-conf protocol: expected http or https, got {protocol!r}")
    return conf


def parse_endpoints(value: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """HOST[:PORT],HOST[:PORT],... (an etcd cluster's members)."""
    items = [item for item in str(value).split(",") if item.strip()]
    if not items:
        raise UsageError("--rdzv-endpoint: empty endpoint")
    if len(items) > MAX_ENDPOINTS:
        raise UsageError(f"--rdzv-endpoint: more than {MAX_ENDPOINTS} endpoints")
    endpoints = tuple(parse_endpoint(item, default_port) for item in items)
    if any(port == 0 for _, port in endpoints):
        raise UsageError("--rdzv-endpoint: an etcd endpoint needs a real port, not 0")
    return endpoints


def _parse_bool(flag: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off"):
        return False
    raise UsageError(f"{flag}: expected true or false, got {raw!r}")


def parse_signals(value: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    numbers: list[int] = []
    names: list[str] = []
    for raw in str(value).split(","):
        name = raw.strip().upper()
        if not name:
            continue
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None)
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(
                f"--signals-to-handle: {raw.strip()!r} is not a signal rtrain can handle"
            )
        numbers.append(int(sig))
        names.append(name)
    return tuple(numbers), tuple(names)


def parse_ranks_filter(value: str) -> frozenset[int] | None:
    text = str(value).strip()
    if not text:
        return None
    numbers = [ascii_int(item) for item in text.split(",")]
    if any(n is None or n > MAX_NPROC for n in numbers):
        raise UsageError(
            f"--local-ranks-filter: expected comma-separated local ranks, got {value!r}"
        )
    return frozenset(n for n in numbers if n is not None)


def parse_preload(value: str, start_method: str | None = None) -> tuple[str, ...]:
    """--preload's modules; none under --start-method spawn, whose workers all start as
    fresh interpreters (the pool only forks and execs them)."""
    text = str(value).strip()
    if text.lower() in ("", "none") or start_method == "spawn":
        return ()
    modules = tuple(item.strip() for item in text.split(",") if item.strip())
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise UsageError(f"--preload: {module!r} is not a module name")
    return modules


def non_negative_int(flag: str, value: Any) -> int:
    number = ascii_int(value)
    if number is None or not 0 <= number < MAX_COUNT:
        raise UsageError(
            f"{flag}: expected a non-negative integer below {MAX_COUNT}, got {value!r}"
        )
    return number


def positive_int(flag: str, value: Any) -> int:
    number = non_negative_int(flag, value)
    if number == 0:
        raise UsageError(f"{flag}: expected a positive integer, got {value!r}")
    return number


def positive_float(flag: str, value: Any) -> float:
    return seconds_value(flag, value)


def non_negative_float(flag: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected a number >= 0, got {value!r}") from None
    if not (math.isfinite(number) and 0 <= number <= MAX_SECONDS):
        raise UsageError(f"{flag}: expected a number >= 0 and <= {MAX_SECONDS:g}, got {value!r}")
    return number


def port_number(flag: str, value: Any) -> int:
    port = ascii_int(value)
    if port is None:
        raise UsageError(f"{flag}: expected a port number, got {value!r}")
    if not 0 <= port < 65536:
        raise UsageError(f"{flag}: port must be 0-65535, got {value!r}")
    return port


SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(flag: str, value: Any) -> int:
    """A byte count: 1073741824, 512M, 8G (binary units; a trailing B or iB is allowed)."""
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (text[:-1], text[-1]) if text[-1:] in SIZE_UNITS and text[-1:] else (text, "")
    if not _SIZE.fullmatch(number.strip()):
        raise UsageError(f"{flag}: expected a size such as 512M or 8G, got {value!r}")
    size = float(number) * SIZE_UNITS[unit]
    if not 0 < size <= MAX_SIZE:
        raise UsageError(f"{flag}: expected a size above 0 and at most 1 EiB, got {value!r}")
    return int(size)
