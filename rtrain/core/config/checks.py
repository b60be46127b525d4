"""What each row of the settings table checks (gunicorn's Setting.validator): how a
flag's raw value -- a string from the command line or PET_*, the table's default, or
what Slurm filled in -- becomes its typed value, or one UsageError line naming the flag
(exit 64). build_launch_spec runs every row's check, then only the rules between flags.

A new kind of value is one Check here; `bad` is a raw value it refuses, which
tests/unit/core/test_settings.py feeds to every row that carries it. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import UsageError
from .endpoints import RDZV_BACKENDS, split_endpoints
from .flag_values import (
    non_negative_float,
    non_negative_int,
    parse_nnodes,
    parse_preload,
    parse_ranks_filter,
    parse_signals,
    parse_size,
    parse_stream_map,
    port_number,
    positive_float,
    positive_int,
    validate_nproc,
)
from .rdzv_conf import parse_rdzv_conf

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Row(Protocol):
    """What a check reads of its row (core/config/settings.py's Setting)."""

    @property
    def flag(self) -> str: ...

    @property
    def default(self) -> Any: ...

    @property
    def choices(self) -> tuple[str, ...] | None: ...


@dataclass(frozen=True)
class Check:
    """One kind of flag value: parse(row, raw) -> the typed value, or UsageError."""

    parse: Callable[[Row, Any], Any]
    bad: Any  # a raw value this check refuses (the settings test tries it on every row)

    def __call__(self, row: Row, raw: Any) -> Any:
        return self.parse(row, raw)


def by_flag(parse: Callable[[str, Any], Any], bad: Any) -> Check:
    """A parser of flag_values.py's kind, parse(flag, raw), as a check."""
    return Check(lambda row, raw: parse(row.flag, raw), bad)


def of_value(parse: Callable[[Any], Any], bad: Any) -> Check:
    """A parser of one flag's values that names its flag itself, parse(raw)."""
    return Check(lambda row, raw: parse(raw), bad)


def optional(check: Check, unset: tuple[Any, ...] = (None, "")) -> Check:
    """The values in unset mean not set (None); any other is checked."""
    return Check(lambda row, raw: None if _among(raw, unset) else check(row, raw), check.bad)


def or_default(check: Check) -> Check:
    """None or an empty value stand for the row's default."""
    return Check(
        lambda row, raw: check(row, row.default if _among(raw, (None, "")) else raw), check.bad
    )


def _among(raw: Any, values: tuple[Any, ...]) -> bool:
    return any(raw is v or (type(raw) is type(v) and raw == v) for v in values)


def _text(row: Row, raw: Any) -> str:
    text = str(raw)
    if _CONTROL.search(text):
        raise UsageError(f"{row.flag}: control characters are not allowed, got {text!r}")
    return text


def _switch(row: Row, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    raise UsageError(f"{row.flag}: a switch takes no value, got {raw!r}")


def _choice(row: Row, raw: Any) -> str:
    text = str(raw).strip()
    choices = row.choices or ()
    if text not in choices:
        raise UsageError(f"{row.flag}: expected one of {', '.join(choices)}, got {raw!r}")
    return text


def _backend(row: Row, raw: Any) -> str:
    backend = str(raw).strip()
    if backend not in RDZV_BACKENDS:
        raise UsageError(
            f"{row.flag}: unknown backend {backend!r} (choose from {', '.join(RDZV_BACKENDS)})"
        )
    return backend


# Free text: names, hosts, paths (one line: no control characters).
TEXT = Check(_text, "a\nb")
# A store_true flag (argparse and _env_switch hand on a bool).
SWITCH = Check(_switch, "yes")
# One of the row's choices; ON_OFF: its `on` as True.
CHOICE = Check(_choice, "bogus")
ON_OFF = Check(lambda row, raw: _choice(row, raw) == "on", "maybe")
COUNT = by_flag(non_negative_int, "-1")  # 0, 1, ...
POSITIVE = by_flag(positive_int, "0")  # 1, 2, ...
SECONDS = by_flag(positive_float, "inf")  # > 0
SECONDS_OR_ZERO = by_flag(non_negative_float, "-1")  # >= 0 (0: off, never)
PORT = by_flag(port_number, "65536")
SIZE = by_flag(parse_size, "8X")  # bytes: 512M, 8G
STREAMS = by_flag(parse_stream_map, "7")  # 0-3 or LOCAL_RANK:MASK,...
NODES = of_value(parse_nnodes, "3:2")  # NodeRange
NPROC = of_value(validate_nproc, "0")  # 1-1024, auto, cpu, gpu, xpu
RANKS = of_value(parse_ranks_filter, "a,b")  # frozenset of local ranks, or None
SIGNALS = of_value(parse_signals, "SIGKILL")  # (numbers, names)
MODULES = of_value(parse_preload, "not a module")  # module names
BACKEND = Check(_backend, "carrier-pigeon")
ENDPOINTS = of_value(lambda raw: split_endpoints(raw or ""), "h:99999")  # ((host, port|None),)
RDZV_CONF = of_value(lambda raw: parse_rdzv_conf(raw or ""), "bogus=1")  # dict
