"""LaunchSpec: the parsed, validated form of torchrun's command line.

The cli turns argv (and PET_* defaults) into a flat mapping of raw values;
`build_launch_spec` validates every value and resolves torchrun's implicit
rules (standalone, static single node), so that the agent never sees a value
it has to second-guess. Pure: no processes, no I/O.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rtrain.core.errors import UsageError

RDZV_BACKENDS = ("static", "c10d")
# torchrun accepts these; rtrain's etcd support is its own issue, so say so clearly.
UNSUPPORTED_RDZV_BACKENDS = ("etcd", "etcd-v2")
NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")
DEFAULT_C10D_PORT = 29400
DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0

# --rdzv-conf keys with torchrun's defaults (seconds).
RDZV_CONF_DEFAULTS: dict[str, float] = {
    "join_timeout": 600.0,
    "last_call_timeout": 30.0,
    "close_timeout": 30.0,
    "heartbeat_timeout": 5.0,
    "read_timeout": 60.0,
}
RDZV_CONF_FLAGS = ("is_host",)
RDZV_CONF_STRINGS = ("store_type",)

EntryKind = Literal["script", "module", "exec"]


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


@dataclass(frozen=True)
class RdzvSpec:
    backend: str
    host: str
    port: int
    run_id: str
    join_timeout: float
    last_call_timeout: float
    close_timeout: float
    heartbeat_timeout: float
    read_timeout: float
    # None: decide by matching the endpoint against this node's addresses.
    is_host: bool | None


@dataclass(frozen=True)
class EntryPoint:
    kind: EntryKind
    target: str
    args: tuple[str, ...]

    @property
    def display_name(self) -> str:
        return self.target


@dataclass(frozen=True)
class LaunchSpec:
    nodes: NodeRange
    nproc_per_node: str
    rdzv: RdzvSpec
    node_rank: int | None
    max_restarts: int
    monitor_interval: float
    role: str
    entrypoint: EntryPoint
    log_dir: str | None
    redirects: StreamMap
    tee: StreamMap
    local_ranks_filter: frozenset[int] | None
    local_addr: str | None
    signals_to_handle: tuple[int, ...]
    shutdown_timeout: float
    standalone: bool
    virtual_local_rank: bool
    preload: tuple[str, ...]
    # Flags given on the command line that rtrain accepts but does not act on.
    ignored_flags: tuple[str, ...] = ()
    signal_names: tuple[str, ...] = ()


def parse_nnodes(value: str) -> NodeRange:
    text = str(value).strip()
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"--nnodes: expected N or MIN:MAX with positive integers, got {value!r}")
    lo, hi = (int(parts[0]), int(parts[-1]))
    if lo < 1:
        raise UsageError(f"--nnodes: the node count must be at least 1, got {value!r}")
    if lo > hi:
        raise UsageError(f"--nnodes: MIN must not exceed MAX, got {value!r}")
    return NodeRange(lo, hi)


def validate_nproc(value: str) -> str:
    text = str(value).strip()
    if text in NPROC_KEYWORDS:
        return text
    if not text.isdigit() or int(text) < 1:
        raise UsageError(
            f"--nproc-per-node: expected a positive integer or one of "
            f"{', '.join(NPROC_KEYWORDS)}, got {value!r}"
        )
    return str(int(text))


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
    if text.isdigit():
        mask = int(text)
        _check_mask(flag, mask, value)
        return StreamMap(default=mask)
    per_rank: dict[int, int] = {}
    for item in text.split(","):
        rank, sep, mask_text = item.partition(":")
        if not sep or not rank.strip().isdigit() or not mask_text.strip().isdigit():
            raise UsageError(f"{flag}: expected 0-3 or LOCAL_RANK:MASK,..., got {value!r}")
        mask = int(mask_text)
        _check_mask(flag, mask, value)
        per_rank[int(rank)] = mask
    return StreamMap(default=0, per_rank=per_rank)


def _check_mask(flag: str, mask: int, value: str) -> None:
    if mask not in (0, 1, 2, 3):
        raise UsageError(f"{flag}: stream mask must be 0, 1, 2 or 3, got {value!r}")


def parse_endpoint(value: str, default_port: int) -> tuple[str, int]:
    text = str(value).strip()
    if not text:
        raise UsageError("--rdzv-endpoint: empty endpoint")
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise UsageError(f"--rdzv-endpoint: missing host in {value!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise UsageError(f"--rdzv-endpoint: port must be 0-65535, got {value!r}")
    return host, int(port_text)


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
        if key in RDZV_CONF_DEFAULTS:
            try:
                seconds = float(raw)
            except ValueError:
                raise UsageError(
                    f"--rdzv-conf: {key} must be a number of seconds, got {raw!r}"
                ) from None
            if seconds <= 0:
                raise UsageError(f"--rdzv-conf: {key} must be positive, got {raw!r}")
            conf[key] = seconds
        elif key in RDZV_CONF_FLAGS:
            conf[key] = _parse_bool(f"--rdzv-conf {key}", raw)
        elif key in RDZV_CONF_STRINGS:
            conf[key] = raw
        else:
            known = ", ".join([*RDZV_CONF_DEFAULTS, *RDZV_CONF_FLAGS, *RDZV_CONF_STRINGS])
            raise UsageError(f"--rdzv-conf: unknown key {key!r} (known: {known})")
    return conf


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
    try:
        ranks = frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise UsageError(
            f"--local-ranks-filter: expected comma-separated local ranks, got {value!r}"
        ) from None
    if any(rank < 0 for rank in ranks):
        raise UsageError(f"--local-ranks-filter: ranks must not be negative, got {value!r}")
    return ranks


def parse_preload(value: str) -> tuple[str, ...]:
    text = str(value).strip()
    if text.lower() in ("", "none"):
        return ()
    modules = tuple(item.strip() for item in text.split(",") if item.strip())
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise UsageError(f"--preload: {module!r} is not a module name")
    return modules


def _non_negative_int(flag: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected a non-negative integer, got {value!r}") from None
    if number < 0:
        raise UsageError(f"{flag}: expected a non-negative integer, got {value!r}")
    return number


def _positive_float(flag: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected a positive number of seconds, got {value!r}") from None
    if not number > 0:
        raise UsageError(f"{flag}: expected a positive number of seconds, got {value!r}")
    return number


def build_launch_spec(raw: Mapping[str, Any]) -> LaunchSpec:
    """Validate raw flag values (keys are torchrun's argparse dests) into a LaunchSpec."""
    nodes = parse_nnodes(raw["nnodes"])
    nproc = validate_nproc(raw["nproc_per_node"])
    backend = str(raw["rdzv_backend"]).strip()
    if backend in UNSUPPORTED_RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend={backend}: not supported yet; use c10d (rtrain's TCPStore) or static"
        )
    if backend not in RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend: unknown backend {backend!r} (choose from {', '.join(RDZV_BACKENDS)})"
        )
    conf = parse_rdzv_conf(raw.get("rdzv_conf", ""))
    standalone = bool(raw.get("standalone"))
    endpoint = str(raw.get("rdzv_endpoint") or "").strip()
    run_id = str(raw.get("rdzv_id") or "none")
    master_addr = str(raw.get("master_addr") or "127.0.0.1")
    master_port = raw.get("master_port")
    node_rank_raw = _non_negative_int("--node-rank", raw.get("node_rank", 0))

    # torchrun: static, one node, no endpoint and no master port behaves as --standalone.
    implicit_standalone = (
        backend == "static" and not endpoint and master_port is None and nodes.max_nodes == 1
    )
    node_rank: int | None = None
    if standalone or implicit_standalone:
        if standalone and nodes.max_nodes != 1:
            raise UsageError("--standalone runs a single node; drop --nnodes or set it to 1")
        backend, host, port = "c10d", "localhost", 0
        nodes = NodeRange(1, 1)
        if standalone or run_id == "none":
            run_id = str(uuid.uuid4())
    elif backend == "static":
        if nodes.is_elastic:
            raise UsageError(
                f"--nnodes={raw['nnodes']}: the static backend needs a fixed node count"
            )
        if endpoint:
            host, port = parse_endpoint(endpoint, DEFAULT_MASTER_PORT)
        else:
            port_value = DEFAULT_MASTER_PORT if master_port is None else master_port
            host, port = master_addr, _port("--master-port", port_value)
        if node_rank_raw >= nodes.max_nodes:
            raise UsageError(
                f"--node-rank={node_rank_raw} is out of range for --nnodes={nodes.max_nodes}"
            )
        node_rank = node_rank_raw
    else:
        if not endpoint:
            raise UsageError("--rdzv-backend=c10d needs --rdzv-endpoint HOST[:PORT]")
        host, port = parse_endpoint(endpoint, DEFAULT_C10D_PORT)

    entry = _entrypoint(raw)
    shutdown = raw.get("shutdown_timeout")
    signal_numbers, signal_names = parse_signals(
        raw.get("signals_to_handle") or "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    )
    return LaunchSpec(
        nodes=nodes,
        nproc_per_node=nproc,
        rdzv=RdzvSpec(
            backend=backend,
            host=host,
            port=port,
            run_id=run_id,
            join_timeout=conf["join_timeout"],
            last_call_timeout=conf["last_call_timeout"],
            close_timeout=conf["close_timeout"],
            heartbeat_timeout=conf["heartbeat_timeout"],
            read_timeout=conf["read_timeout"],
            is_host=conf["is_host"],
        ),
        node_rank=node_rank,
        max_restarts=_non_negative_int("--max-restarts", raw.get("max_restarts", 0)),
        monitor_interval=_positive_float("--monitor-interval", raw.get("monitor_interval", 0.1)),
        role=str(raw.get("role") or "default"),
        entrypoint=entry,
        log_dir=raw.get("log_dir") or None,
        redirects=parse_stream_map("--redirects", raw.get("redirects", "0")),
        tee=parse_stream_map("--tee", raw.get("tee", "0")),
        local_ranks_filter=parse_ranks_filter(raw.get("local_ranks_filter", "")),
        local_addr=raw.get("local_addr") or None,
        signals_to_handle=signal_numbers,
        signal_names=signal_names,
        shutdown_timeout=(
            DEFAULT_SHUTDOWN_TIMEOUT_S
            if shutdown is None
            else _positive_float("--shutdown-timeout", shutdown)
        ),
        standalone=standalone or implicit_standalone,
        virtual_local_rank=bool(raw.get("virtual_local_rank")),
        preload=parse_preload(raw.get("preload", "torch")),
        ignored_flags=tuple(raw.get("ignored_flags", ())),
    )


def _port(flag: str, value: Any) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected a port number, got {value!r}") from None
    if not 0 <= port < 65536:
        raise UsageError(f"{flag}: port must be 0-65535, got {value!r}")
    return port


def _entrypoint(raw: Mapping[str, Any]) -> EntryPoint:
    target = str(raw.get("training_script") or "").strip()
    if not target:
        raise UsageError("missing the training script (or module, with -m)")
    args = tuple(str(a) for a in raw.get("training_script_args") or ())
    module, no_python = bool(raw.get("module")), bool(raw.get("no_python"))
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if raw.get("run_path") and (module or no_python):
        raise UsageError("--run-path cannot be combined with -m or --no-python")
    kind: EntryKind = "module" if module else "exec" if no_python else "script"
    return EntryPoint(kind=kind, target=target, args=args)
