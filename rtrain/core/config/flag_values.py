"""Parsers for the values of torchrun's flags: each turns one raw string into a typed
value or raises UsageError naming the flag (endpoints.py and rdzv_conf.py hold those
of --rdzv-endpoint and --rdzv-conf; checks.py gives them to the settings table's rows).
Pure: no processes, no I/O."""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
# Bounds past which a value is a typo, not a configuration: they keep absurd numbers
# from turning into sleeps that never end, overflows or a launcher forking for ever.
MAX_SECONDS = 7 * 24 * 3600.0
MAX_COUNT = 1 << 31
MAX_NODES = 65536
MAX_NPROC = 1024
MAX_SIZE = 1 << 60
_INT = re.compile(r"\+?[0-9]{1,19}")  # ASCII digits only (str.isdigit() takes "²", "١")
_SIZE = re.compile(r"[0-9]{1,19}(\.[0-9]{1,9})?")


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


def parse_preload(value: str) -> tuple[str, ...]:
    """--preload's modules (`none` or empty: none)."""
    text = str(value).strip()
    if text.lower() in ("", "none"):
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
