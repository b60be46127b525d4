"""etcd's v3 JSON gateway on the wire: its errors, base64 keys and values, and answers
read with a bound and checked field by field (an endpoint that is not etcd is named,
never trusted; nothing is unpickled)."""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from typing import Any

from ....core.errors import RendezvousError

MAX_ANSWER_BYTES = 64 << 20


class LeaseNotFound(RendezvousError):
    """etcd no longer has the lease: it expired (this agent stopped renewing it)."""


class NotEtcd(RendezvousError):
    """An endpoint answered, but not as etcd's v3 gateway does."""


@dataclass(frozen=True)
class EtcdTls:
    """--rdzv-conf protocol=https, cacert=, cert=, key= (torchrun's etcd keys)."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.cacert)
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context


def b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise NotEtcd(f"{what} is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise NotEtcd(f"{what} is not base64") from None


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for every key that starts with prefix."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


def json_object(raw: bytes) -> dict[str, Any] | None:
    if len(raw) > MAX_ANSWER_BYTES:
        return None
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def int_field(answer: dict[str, Any], name: str) -> int:
    """etcd writes int64 fields as JSON strings and leaves zero values out."""
    value = answer.get(name, "0")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise NotEtcd(f"etcd's answer has a non-integer {name}: {str(value)[:40]!r}") from None


def revision(answer: dict[str, Any]) -> int:
    header = answer.get("header")
    if not isinstance(header, dict):
        raise NotEtcd("etcd's answer has no header")
    return int_field(header, "revision")


def apply_events(values: dict[str, bytes], events: object) -> int:
    """A watch message's events applied to `values` (key -> value; a DELETE removes the
    key); the highest mod_revision among them (0: none). What is not etcd's shape is
    refused, never half applied past the bad event."""
    if not isinstance(events, list):
        raise NotEtcd("watch events that are not a list")
    newest = 0
    for event in events:
        kv = event.get("kv") if isinstance(event, dict) else None
        if not isinstance(kv, dict):
            raise NotEtcd("a watch event without a kv")
        key = unb64(kv.get("key"), "a watched key").decode("utf-8", "replace")
        if event.get("type") == "DELETE":
            values.pop(key, None)
        else:
            values[key] = unb64(kv.get("value", ""), "a watched value")
        newest = max(newest, int_field(kv, "mod_revision"))
    return newest
