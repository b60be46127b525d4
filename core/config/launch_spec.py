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

from ..errors import UsageError
from ..layout.recycle import check_profile
from ..layout.topology import Layout
from .flag_values import (
    RDZV_CONF_DEFAULTS,
    NodeRange,
    StreamMap,
    non_negative_float,
    non_negative_int,
    parse_endpoint,
    parse_endpoints,
    parse_nnodes,
    parse_preload,
    parse_ranks_filter,
    parse_rdzv_conf,
    parse_signals,
    parse_size,
    parse_stream_map,
    port_number,
    positive_float,
    positive_int,
    resolve_nproc,
    validate_nproc,
)
from .settings import DEFAULTS, default
from .slurm_env import SlurmJob

__all__ = [
    "EntryPoint",
    "FaultSpec",
    "LaunchSpec",
    "Layout",
    "NodeRange",
    "RdzvSpec",
    "SnapshotSpec",
    "StreamMap",
    "build_launch_spec",
    "resolve_nproc",
]

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
# torchrun's two etcd backends are one here: both talk etcd's v3 API (v2 is gone from
# etcd 3.6), through agent/store/etcd_client.py.
ETCD_BACKENDS = ("etcd", "etcd-v2")
DEFAULT_C10D_PORT = 29400
DEFAULT_ETCD_PORT = 2379
DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0

EntryKind = Literal["script", "module", "exec"]


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
    # etcd: every member of the cluster (host, port is the first); and TLS.
    endpoints: tuple[tuple[str, int], ...] = ()
    protocol: str = "http"
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def is_etcd(self) -> bool:
        return self.backend in ETCD_BACKENDS


@dataclass(frozen=True)
class FaultSpec:
    """How faults are detected and how often a node may fail (rtrain's own flags)."""

    # Agents renew their lease every heartbeat_interval; a lease not renewed for
    # heartbeat_timeout means the node is lost.
    heartbeat_interval: float = default("heartbeat-interval")
    heartbeat_timeout: float = RDZV_CONF_DEFAULTS["heartbeat_timeout"]
    # A worker that called rtrain.core.heartbeat() and then stopped for this long is hung.
    hang_timeout: float = default("hang-timeout")
    # A node charged this many failures is excluded from the job; 0: never.
    max_node_failures: int = default("max-node-failures")
    # A node whose workers fail again within RESTART_RESET_S of starting waits this
    # long before its next restart, doubling each time up to RESTART_BACKOFF_CAP_S.
    restart_backoff: float = default("restart-backoff")
    # Stop whatever the workers started when they stop (agent/workers/process_tree.py).
    kill_process_tree: bool = default("kill-process-tree")


@dataclass(frozen=True)
class HealthSpec:
    """GPU health in the agent (NVML): how often to sample, and whether to drain."""

    # Every check every interval seconds (XID events are taken as they come); 0: off.
    interval: float = default("health-interval")
    # Under Slurm, drain a node whose GPU fault takes it out of the job.
    drain_on_fault: bool = default("drain-on-fault")


@dataclass(frozen=True)
class ObserveSpec:
    """What the agent tells operators besides its log lines."""

    # Structured events in <run log dir>/events.jsonl (core/observe/events.py).
    events: bool = default("events") == "on"
    # This node's metrics in Prometheus text format (core/observe/metrics.py); None: none.
    metrics_file: str | None = None
    # ... and over HTTP on the node's address, at this port; None: not served.
    metrics_port: int | None = None


@dataclass(frozen=True)
class SnapshotSpec:
    """In-memory snapshots: how much shared memory they may use, how many copies to keep."""

    # Bytes of this node's shared memory for its workers' slots and peers' replicas;
    # None: half of /dev/shm.
    memory: int | None = None
    # Copies of each shard on distinct nodes, the original included.
    copies: int = default("snapshot-copies")
    # Replicas to a DP twin's node as the chunks the twin's shard lacks (delta.py).
    dp_delta: bool = default("snapshot-dp-delta") == "on"
    # The last resort when no copy of a shard survives; rtrain writes one every
    # checkpoint_every steps (0: never, only read what is there).
    checkpoint_dir: str | None = None
    checkpoint_every: int = default("checkpoint-every")
    # Complete checkpoints kept in checkpoint_dir, older steps deleted (0: all kept).
    keep_checkpoints: int = default("keep-checkpoints")
    # A file (mode 0600) holding the job secret that authenticates shard servers.
    secret_file: str | None = None


@dataclass(frozen=True)
class EntryPoint:
    kind: EntryKind
    target: str
    args: tuple[str, ...]


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
    # Workers started as fresh interpreters (--start-method spawn), not forked from the pool.
    fresh_workers: bool = False
    # Flags given on the command line that rtrain accepts but does not act on.
    ignored_flags: tuple[str, ...] = ()
    signal_names: tuple[str, ...] = ()
    layout: Layout = field(default_factory=Layout)
    faults: FaultSpec = field(default_factory=FaultSpec)
    snapshots: SnapshotSpec = field(default_factory=SnapshotSpec)
    health: HealthSpec = field(default_factory=HealthSpec)
    # The Slurm job rtrain runs in (its values already applied to the flags), or None.
    slurm: SlurmJob | None = None
    # --recycle-profile, read and checked: plan what each generation's losses cost.
    recycle_profile: dict[str, Any] | None = None
    observe: ObserveSpec = field(default_factory=ObserveSpec)


def build_launch_spec(given: Mapping[str, Any]) -> LaunchSpec:
    """Validate raw flag values (keys are torchrun's argparse dests) into a LaunchSpec;
    a flag not given takes its default from the settings table."""
    raw = {**DEFAULTS, **given}
    nodes = parse_nnodes(raw["nnodes"])
    nproc = validate_nproc(raw["nproc_per_node"])
    backend = str(raw["rdzv_backend"]).strip()
    if backend not in RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend: unknown backend {backend!r} (choose from {', '.join(RDZV_BACKENDS)})"
        )
    conf = parse_rdzv_conf(raw["rdzv_conf"])
    standalone = bool(raw["standalone"])
    endpoint = str(raw["rdzv_endpoint"] or "").strip()
    run_id = str(raw["rdzv_id"] or DEFAULTS["rdzv_id"])
    master_addr = str(raw["master_addr"] or DEFAULTS["master_addr"])
    master_port = raw["master_port"]
    node_rank_raw = non_negative_int("--node-rank", raw["node_rank"])

    # torchrun: static, one node, no endpoint and no master port behaves as --standalone.
    implicit_standalone = (
        backend == "static" and not endpoint and master_port is None and nodes.max_nodes == 1
    )
    node_rank: int | None = None
    if standalone or implicit_standalone:
        if standalone and nodes.max_nodes != 1:
            raise UsageError("--standalone runs a single node; drop --nnodes or set it to 1")
        # a loopback literal: the store listens there alone (a name would listen everywhere)
        backend, host, port = "c10d", "127.0.0.1", 0
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
            host, port = master_addr, port_number("--master-port", port_value)
        if node_rank_raw >= nodes.max_nodes:
            raise UsageError(
                f"--node-rank={node_rank_raw} is out of range for --nnodes={nodes.max_nodes}"
            )
        node_rank = node_rank_raw
    elif backend in ETCD_BACKENDS:
        if not endpoint:
            raise UsageError(
                f"--rdzv-backend={backend} needs --rdzv-endpoint HOST[:PORT][,HOST[:PORT]...]"
            )
        endpoints = parse_endpoints(endpoint, DEFAULT_ETCD_PORT)
        host, port = endpoints[0]
    else:
        if not endpoint:
            raise UsageError("--rdzv-backend=c10d needs --rdzv-endpoint HOST[:PORT]")
        host, port = parse_endpoint(endpoint, DEFAULT_C10D_PORT)
    if backend not in ETCD_BACKENDS:
        endpoints = ((host, port),)
        tls_keys = [k for k in ("protocol", "cacert", "cert", "key") if k in conf]
        if tls_keys:
            raise UsageError(
                f"--rdzv-conf {tls_keys[0]}: for the etcd backends (TCPStore has no TLS)"
            )
    elif conf.get("key") and not conf.get("cert"):
        raise UsageError("--rdzv-conf key: needs cert too")

    entry = _entrypoint(raw)
    shutdown = raw["shutdown_timeout"]
    slurm = raw.get("slurm")
    signal_numbers, signal_names = parse_signals(
        raw["signals_to_handle"] or DEFAULTS["signals_to_handle"]
    )
    if slurm is not None and signal.SIGUSR1 not in signal_numbers:
        # Slurm's warning before the time limit (--signal=USR1@T): save and requeue.
        signal_numbers = (*signal_numbers, signal.SIGUSR1)
        signal_names = (*signal_names, "SIGUSR1")
    layout = _layout(raw, nodes, nproc)
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
            endpoints=endpoints,
            protocol=conf.get("protocol", "http"),
            cacert=conf.get("cacert"),
            cert=conf.get("cert"),
            key=conf.get("key"),
        ),
        node_rank=node_rank,
        max_restarts=non_negative_int("--max-restarts", raw["max_restarts"]),
        monitor_interval=positive_float("--monitor-interval", raw["monitor_interval"]),
        role=str(raw["role"] or DEFAULTS["role"]),
        entrypoint=entry,
        log_dir=raw["log_dir"] or None,
        redirects=parse_stream_map("--redirects", raw["redirects"]),
        tee=parse_stream_map("--tee", raw["tee"]),
        local_ranks_filter=parse_ranks_filter(raw["local_ranks_filter"]),
        local_addr=raw["local_addr"] or None,
        signals_to_handle=signal_numbers,
        signal_names=signal_names,
        shutdown_timeout=(
            DEFAULT_SHUTDOWN_TIMEOUT_S
            if shutdown is None
            else positive_float("--shutdown-timeout", shutdown)
        ),
        standalone=standalone or implicit_standalone,
        virtual_local_rank=bool(raw["virtual_local_rank"]),
        preload=parse_preload(raw["preload"], raw["start_method"]),
        fresh_workers=raw["start_method"] == "spawn",
        ignored_flags=tuple(raw.get("ignored_flags", ())),
        layout=layout,
        faults=_faults(raw, conf["heartbeat_timeout"]),
        snapshots=SnapshotSpec(
            memory=None
            if raw["snapshot_memory"] in (None, "")
            else parse_size("--snapshot-memory", raw["snapshot_memory"]),
            copies=positive_int("--snapshot-copies", raw["snapshot_copies"]),
            dp_delta=raw["snapshot_dp_delta"] == "on",
            checkpoint_dir=raw["checkpoint_dir"] or None,
            checkpoint_every=non_negative_int("--checkpoint-every", raw["checkpoint_every"]),
            keep_checkpoints=non_negative_int("--keep-checkpoints", raw["keep_checkpoints"]),
            secret_file=raw["secret_file"] or None,
        ),
        slurm=slurm,
        recycle_profile=None
        if raw.get("recycle_profile_data") is None
        else check_profile(raw["recycle_profile_data"], layout.pp),
        health=HealthSpec(
            interval=non_negative_float("--health-interval", raw["health_interval"]),
            drain_on_fault=bool(raw["drain_on_fault"]),
        ),
        observe=ObserveSpec(
            events=raw["events"] == "on",
            metrics_file=raw["metrics_file"] or None,
            metrics_port=None
            if raw["metrics_port"] in (None, "")
            else port_number("--metrics-port", raw["metrics_port"]),
        ),
    )


def _layout(raw: Mapping[str, Any], nodes: NodeRange, nproc: str) -> Layout:
    tp = positive_int("--tp", raw["tp"])
    pp = positive_int("--pp", raw["pp"])
    layout = Layout(tp=tp, pp=pp)
    if nproc.isdigit():  # gpu/auto/cpu are resolved on the node; checked there
        if int(nproc) % tp:
            raise UsageError(
                f"--tp={tp} must divide --nproc-per-node={nproc}: "
                "a tensor-parallel group must stay on one node"
            )
        if nodes.min_nodes * int(nproc) < layout.replica_size:
            raise UsageError(
                f"--pp={pp} x --tp={tp} needs {layout.replica_size} workers, but "
                f"{nodes.min_nodes} node(s) x {nproc} give {nodes.min_nodes * int(nproc)}"
            )
    return layout


def _faults(raw: Mapping[str, Any], conf_heartbeat_timeout: float) -> FaultSpec:
    interval = positive_float("--heartbeat-interval", raw["heartbeat_interval"])
    given = raw["heartbeat_timeout"]
    timeout = (
        conf_heartbeat_timeout if given is None else positive_float("--heartbeat-timeout", given)
    )
    if timeout <= interval:
        raise UsageError(
            f"--heartbeat-timeout={timeout:g} must be longer than --heartbeat-interval={interval:g}"
        )
    return FaultSpec(
        heartbeat_interval=interval,
        heartbeat_timeout=timeout,
        hang_timeout=positive_float("--hang-timeout", raw["hang_timeout"]),
        max_node_failures=non_negative_int("--max-node-failures", raw["max_node_failures"]),
        restart_backoff=non_negative_float("--restart-backoff", raw["restart_backoff"]),
        kill_process_tree=bool(raw["kill_process_tree"]),
    )


def _entrypoint(raw: Mapping[str, Any]) -> EntryPoint:
    target = str(raw.get("training_script") or "").strip()
    if not target:
        raise UsageError("missing the training script (or module, with -m)")
    args = tuple(str(a) for a in raw.get("training_script_args") or ())
    module, no_python = bool(raw["module"]), bool(raw["no_python"])
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if raw["run_path"] and (module or no_python):
        raise UsageError("--run-path cannot be combined with -m or --no-python")
    kind: EntryKind = "module" if module else "exec" if no_python else "script"
    return EntryPoint(kind=kind, target=target, args=args)
