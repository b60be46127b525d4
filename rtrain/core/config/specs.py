"""The launch spec's dataclasses: what `rtrain launch` resolved, in parts (the
rendezvous, faults, health, observing, snapshots, the entry point) and whole.

A field that is one flag's checked value, unchanged, is declared `flag_field("name")`:
its default is the settings table's (through the row's check) and `from_values` fills
it from the checked values, so build_launch_spec (launch_spec.py) names only the fields
that rules between flags decide. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, cast

from ..layout.topology import Layout
from .endpoints import ETCD_BACKENDS
from .flag_values import NodeRange, StreamMap
from .rdzv_conf import RDZV_CONF_DEFAULTS
from .settings import typed_default
from .slurm.env import SlurmJob

EntryKind = Literal["script", "module", "exec"]
T = TypeVar("T")
_FLAG = "rtrain.flag"


def flag_field(name: str) -> Any:
    """A spec field holding the flag --name's checked value; the table's default."""
    return field(default_factory=lambda: typed_default(name), metadata={_FLAG: name})


def from_values(cls: type[T], values: Mapping[str, Any], **decided: Any) -> T:
    """cls with every flag field set from values (checked, by dest), the rest from decided."""
    given = {
        f.name: values[f.metadata[_FLAG].replace("-", "_")]
        for f in fields(cast(Any, cls))
        if _FLAG in f.metadata
    }
    return cls(**given, **decided)


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
    heartbeat_interval: float = flag_field("heartbeat-interval")
    heartbeat_timeout: float = RDZV_CONF_DEFAULTS["heartbeat_timeout"]
    # A worker that called rtrain.core.heartbeat() and then stopped for this long is hung.
    hang_timeout: float = flag_field("hang-timeout")
    # A worker that has not called it this long after its start is hung; None: never.
    first_heartbeat_timeout: float | None = flag_field("first-heartbeat-timeout")
    # A node charged this many failures is excluded from the job; 0: never.
    max_node_failures: int = flag_field("max-node-failures")
    # A node charged this many faults within fault_window s joins last, a standby; 0: never.
    standby_after_faults: int = flag_field("standby-after-faults")
    fault_window: float = flag_field("fault-window")
    # A node whose workers fail again within RESTART_RESET_S of starting waits this
    # long before its next restart, doubling each time up to RESTART_BACKOFF_CAP_S.
    restart_backoff: float = flag_field("restart-backoff")
    # Stop whatever the workers started when they stop (agent/workers/process_tree.py).
    kill_process_tree: bool = flag_field("kill-process-tree")
    # Warm spare workers per node, started after each generation's workers; a repair in
    # place hands one a failed rank (agent/repair/warm_spares.py).
    spares_per_node: int = flag_field("spares-per-node")
    # Slow ranks: off, detect or balance (agent/observe/stragglers.py; the workers get it
    # as RTRAIN_STRAGGLERS, core/contract/pace.py).
    stragglers: str = flag_field("stragglers")
    # A rank a straggler this long: its node leaves, as for a GPU fault; 0: never.
    replace_stragglers_after: float = flag_field("replace-stragglers-after")
    # What a SIGTERM means: "leave", "end-job", or None (leave under Kubernetes).
    on_sigterm: str | None = flag_field("on-sigterm")


@dataclass(frozen=True)
class HealthSpec:
    """GPU health in the agent (NVML): how often to sample, and whether to drain."""

    # Every check every interval seconds (XID events are taken as they come); 0: off.
    interval: float = flag_field("health-interval")
    # Under Slurm, drain a node whose GPU fault takes it out of the job.
    drain_on_fault: bool = flag_field("drain-on-fault")


@dataclass(frozen=True)
class ObserveSpec:
    """What the agent tells operators besides its log lines."""

    # Structured events in <run log dir>/events.jsonl (core/observe/events.py).
    events: bool = flag_field("events")
    # This node's metrics in Prometheus text format (core/observe/metrics.py); None: none.
    metrics_file: str | None = flag_field("metrics-file")
    # ... and over HTTP on the node's address, at this port; None: not served.
    metrics_port: int | None = flag_field("metrics-port")


@dataclass(frozen=True)
class SnapshotSpec:
    """In-memory snapshots: how much shared memory they may use, how many copies to keep."""

    # Bytes of this node's shared memory for its workers' slots and peers' replicas;
    # None: half of /dev/shm.
    memory: int | None = flag_field("snapshot-memory")
    # Copies of each shard on distinct nodes, the original included.
    copies: int = flag_field("snapshot-copies")
    # Replicas to a DP twin's node as the chunks the twin's shard lacks (delta.py).
    dp_delta: bool = flag_field("snapshot-dp-delta")
    # The last resort when no copy of a shard survives; rtrain writes one every
    # checkpoint_every steps (0: never, only read what is there).
    checkpoint_dir: str | None = flag_field("checkpoint-dir")
    # Bytes each agent sends its ring successor at start to measure the state network
    # (agent/net/probe.py); None: no probe.
    net_probe: int | None = flag_field("net-probe")
    checkpoint_every: int = flag_field("checkpoint-every")
    # Complete checkpoints kept in checkpoint_dir, older steps deleted (0: all kept).
    keep_checkpoints: int = flag_field("keep-checkpoints")
    # A file (mode 0600) holding the job secret that authenticates shard servers.
    secret_file: str | None = flag_field("secret-file")


@dataclass(frozen=True)
class EntryPoint:
    kind: EntryKind
    target: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class LaunchSpec:
    # Decided by the rules between flags (launch_spec.py).
    nodes: NodeRange
    nproc_per_node: str
    rdzv: RdzvSpec
    node_rank: int | None
    entrypoint: EntryPoint
    signals_to_handle: tuple[int, ...]
    shutdown_timeout: float
    standalone: bool
    preload: tuple[str, ...]
    # Each one flag's checked value.
    max_restarts: int = flag_field("max-restarts")
    monitor_interval: float = flag_field("monitor-interval")
    role: str = flag_field("role")
    log_dir: str | None = flag_field("log-dir")
    # flag_field is a dataclasses.field with a default_factory (ruff cannot tell)
    redirects: StreamMap = flag_field("redirects")  # noqa: RUF009
    tee: StreamMap = flag_field("tee")  # noqa: RUF009
    local_ranks_filter: frozenset[int] | None = flag_field("local-ranks-filter")
    local_addr: str | None = flag_field("local-addr")
    virtual_local_rank: bool = flag_field("virtual-local-rank")
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
