"""--rdzv-conf's k=v,... pairs: torchrun's timeouts, is_host, and etcd's TLS settings.
Each bad pair raises UsageError naming --rdzv-conf and the key. Pure."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .flag_values import seconds_value

# --rdzv-conf keys with torchrun's defaults (seconds).
RDZV_CONF_DEFAULTS: dict[str, float] = {
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "close_timeout": 30.0,
    "heartbeat_timeout": 5.0,
    "read_timeout": 60.0,
}
RDZV_CONF_FLAGS = ("is_host",)
RDZV_CONF_STRINGS = ("store_type", "protocol", "cacert", "cert", "key")
# The keys that only etcd's client reads (TCPStore has no TLS).
RDZV_CONF_TLS = ("protocol", "cacert", "cert", "key")
# torchrun's etcd backends call the join timeout "timeout".
RDZV_CONF_ALIASES = {"timeout": "join_timeout"}
ETCD_PROTOCOLS = ("http", "https")


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


def _parse_bool(flag: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off"):
        return False
    raise UsageError(f"{flag}: expected true or false, got {raw!r}")
