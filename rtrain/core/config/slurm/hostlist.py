"""Slurm hostlist expressions: `n[01-04,07]`, `rack[0-1]_n[1-2]`, `a,b[1-2],c`.

Our own small parser (python-hostlist is GPL). What Slurm accepts, in the order
`scontrol show hostnames` prints it:
- comma-separated groups, commas inside brackets belonging to the bracket;
- in a group, any number of bracket parts, expanded left to right (the rightmost
  varies fastest);
- in brackets, numbers and ranges `lo-hi`, zero padding kept from `lo` (`[08-11]` is
  08 09 10 11).
"""

from __future__ import annotations

import math
import re
from itertools import product

_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() also takes "²" and "١"
MAX_HOSTS = 65536  # a bigger expansion is a typo, not a cluster


class HostlistError(ValueError):
    """A hostlist rtrain cannot expand: the message says where."""


def expand_hostlist(expression: str) -> list[str]:
    text = expression.strip()
    if not text:
        raise HostlistError("empty node list")
    hosts: list[str] = []
    for group in _split_groups(text):
        hosts.extend(_expand_group(group, text))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{text!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


def _split_groups(text: str) -> list[str]:
    groups, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at position {i} in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' at position {i} in {text!r}")
        elif char == "," and depth == 0:
            groups.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {text!r}")
    groups.append(text[start:])
    for group in groups:
        if not group.strip():
            raise HostlistError(f"empty host name in {text!r}")
    return [g.strip() for g in groups]


def _expand_group(group: str, text: str) -> list[str]:
    """One group: literal parts and bracket parts, as a cartesian product."""
    parts: list[list[str]] = []
    rest = group
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            parts.append([rest])
            break
        if open_at:
            parts.append([rest[:open_at]])
        close_at = rest.index("]", open_at)
        parts.append(_expand_brackets(rest[open_at + 1 : close_at], text))
        rest = rest[close_at + 1 :]
    if any(ch.isspace() for p in parts for item in p for ch in item):
        raise HostlistError(f"white space in host name {group!r} in {text!r}")
    if math.prod(len(p) for p in parts) > MAX_HOSTS:
        raise HostlistError(f"{group!r} in {text!r} expands to more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in product(*parts)]


def _expand_brackets(inside: str, text: str) -> list[str]:
    if not inside.strip():
        raise HostlistError(f"empty brackets in {text!r}")
    values: list[str] = []
    for item in inside.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not _DIGITS.fullmatch(lo) or (sep and not _DIGITS.fullmatch(hi)):
            raise HostlistError(f"{item!r} in {text!r} is not a number or a range lo-hi")
        if not sep:
            values.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise HostlistError(f"range {item!r} in {text!r} runs backwards")
        if last - first >= MAX_HOSTS:
            raise HostlistError(f"range {item!r} in {text!r} is too large")
        width = len(lo)
        values.extend(str(n).zfill(width) for n in range(first, last + 1))
    return values


_NUMBERED = re.compile(r"(.*?)([0-9]{1,9})")


def compress_hostlist(hosts: list[str]) -> str:
    """The inverse of expand_hostlist for what --exclude takes: `n[01-03,07],login`.
    Names ending in digits group by prefix and width (zero padding kept); each group's
    numbers become ranges; groups keep the order of their first host."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, int] | str] = []
    for host in dict.fromkeys(hosts):
        match = _NUMBERED.fullmatch(host)
        if match is None:
            plain[host] = None
            order.append(host)
            continue
        key = (match.group(1), len(match.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(match.group(2)))
    parts = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        numbers = sorted(set(groups[item]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{','.join(_ranges(numbers, width))}]")
    return ",".join(parts)


def _ranges(numbers: list[int], width: int) -> list[str]:
    spans: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        first, last = f"{start:0{width}d}", f"{prev:0{width}d}"
        spans.append(first if start == prev else f"{first}-{last}")
        if n is not None:
            start = prev = n
    return spans
