"""build_launch_spec: torchrun's command line, checked, as a LaunchSpec.

The cli turns argv (and PET_* defaults) into a flat mapping of raw values. Each flag's
row of the settings table checks its own value (core/config/checks.py); this module
keeps only the rules between flags: torchrun's implicit rules (standalone, the static
single node), the endpoint and TLS each backend takes, the node rank in range, the
layout against the workers, the heartbeat timeout against its interval, the entry
point's kind, Slurm's signal. The agent never sees a value it has to second-guess.
The spec's dataclasses are specs.py's. Pure: no processes, no I/O.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from ..layout.recycle import check_profile
from ..layout.topology import Layout
from .endpoints import (
    DEFAULT_C10D_PORT,
    DEFAULT_ETCD_PORT,
    DEFAULT_MASTER_PORT,
    ETCD_BACKENDS,
    RDZV_BACKENDS,
    Endpoint,
    with_ports,
)
from .flag_values import NodeRange, StreamMap, resolve_nproc
from .rdzv_conf import RDZV_CONF_TLS
from .settings import DEFAULTS, values
from .specs import (
    EntryKind,
    EntryPoint,
    FaultSpec,
    HealthSpec,
    LaunchSpec,
    ObserveSpec,
    RdzvSpec,
    SnapshotSpec,
    from_values,
)

__all__ = [
    "DEFAULT_C10D_PORT",
    "DEFAULT_ETCD_PORT",
    "DEFAULT_MASTER_PORT",
    "ETCD_BACKENDS",
    "RDZV_BACKENDS",
    "EntryPoint",
    "FaultSpec",
    "HealthSpec",
    "LaunchSpec",
    "Layout",
    "NodeRange",
    "ObserveSpec",
    "RdzvSpec",
    "SnapshotSpec",
    "StreamMap",
    "build_launch_spec",
    "resolve_nproc",
]

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0

MAX_NET_PROBE = 64 << 20  # bytes: the state network probe stays small


def build_launch_spec(given: Mapping[str, Any]) -> LaunchSpec:
    """Check raw flag values (keys are torchrun's argparse dests) into a LaunchSpec; a
    flag not given takes its default from the settings table."""
    raw = {**DEFAULTS, **given}
    checked = values(raw)  # every row's own check: one line naming the flag if bad
    rdzv, nodes, node_rank, standalone = _rendezvous(checked, raw)
    signal_numbers, signal_names = checked["signals_to_handle"]
    slurm = raw.get("slurm")
    if slurm is not None and signal.SIGUSR1 not in signal_numbers:
        # Slurm's warning before the time limit (--signal=USR1@T): save and requeue.
        signal_numbers = (*signal_numbers, signal.SIGUSR1)
        signal_names = (*signal_names, "SIGUSR1")
    layout = _layout(checked, nodes)
    # --start-method spawn: every worker a fresh interpreter; the pool imports nothing.
    fresh = checked["start_method"] == "spawn"
    shutdown = checked["shutdown_timeout"]
    profile = raw.get("recycle_profile_data")
    if (checked["net_probe"] or 0) > MAX_NET_PROBE:
        raise UsageError(f"--net-probe: at most {MAX_NET_PROBE >> 20}M (a probe, not a load)")
    return from_values(
        LaunchSpec,
        checked,
        nodes=nodes,
        nproc_per_node=checked["nproc_per_node"],
        rdzv=rdzv,
        node_rank=node_rank,
        entrypoint=_entrypoint(raw, checked),
        signals_to_handle=signal_numbers,
        signal_names=signal_names,
        shutdown_timeout=DEFAULT_SHUTDOWN_TIMEOUT_S if shutdown is None else shutdown,
        standalone=standalone,
        preload=() if fresh else checked["preload"],
        fresh_workers=fresh,
        ignored_flags=tuple(raw.get("ignored_flags", ())),
        layout=layout,
        faults=_faults(checked, rdzv.heartbeat_timeout),
        snapshots=from_values(SnapshotSpec, checked),
        health=from_values(HealthSpec, checked),
        observe=from_values(ObserveSpec, checked),
        slurm=slurm,
        recycle_profile=None if profile is None else check_profile(profile, layout.pp),
    )


def _rendezvous(
    checked: Mapping[str, Any], raw: Mapping[str, Any]
) -> tuple[RdzvSpec, NodeRange, int | None, bool]:
    """The backend, its store's endpoints and the run id; the node range and this node's
    rank as the backend has them; whether this runs as --standalone."""
    nodes: NodeRange = checked["nnodes"]
    backend: str = checked["rdzv_backend"]
    endpoints: tuple[Endpoint, ...] = checked["rdzv_endpoint"]
    master_port: int | None = checked["master_port"]
    conf: dict[str, Any] = checked["rdzv_conf"]
    run_id: str = checked["rdzv_id"]
    # torchrun: static, one node, no endpoint and no master port behaves as --standalone.
    implicit_standalone = (
        backend == "static" and not endpoints and master_port is None and nodes.max_nodes == 1
    )
    standalone = checked["standalone"] or implicit_standalone
    node_rank: int | None = None
    members: tuple[tuple[str, int], ...]
    if standalone:
        if checked["standalone"] and nodes.max_nodes != 1:
            raise UsageError("--standalone runs a single node; drop --nnodes or set it to 1")
        # a loopback literal: the store listens there alone (a name would listen everywhere)
        backend, members = "c10d", (("127.0.0.1", 0),)
        nodes = NodeRange(1, 1)
        if checked["standalone"] or run_id == "none":
            run_id = str(uuid.uuid4())
    elif backend == "static":
        if nodes.is_elastic:
            raise UsageError(
                f"--nnodes={raw['nnodes']}: the static backend needs a fixed node count"
            )
        if endpoints:
            members = (_one(endpoints, raw["rdzv_endpoint"], backend, DEFAULT_MASTER_PORT),)
        else:
            port = DEFAULT_MASTER_PORT if master_port is None else master_port
            members = ((checked["master_addr"], port),)
        node_rank = checked["node_rank"]
        if node_rank >= nodes.max_nodes:
            raise UsageError(
                f"--node-rank={node_rank} is out of range for --nnodes={nodes.max_nodes}"
            )
    elif backend in ETCD_BACKENDS:
        if not endpoints:
            raise UsageError(
                f"--rdzv-backend={backend} needs --rdzv-endpoint HOST[:PORT][,HOST[:PORT]...]"
            )
        members = with_ports(endpoints, DEFAULT_ETCD_PORT)
    else:
        if not endpoints:
            raise UsageError("--rdzv-backend=c10d needs --rdzv-endpoint HOST[:PORT]")
        members = (_one(endpoints, raw["rdzv_endpoint"], backend, DEFAULT_C10D_PORT),)
    if backend not in ETCD_BACKENDS:
        tls_keys = [k for k in RDZV_CONF_TLS if k in conf]
        if tls_keys:
            raise UsageError(
                f"--rdzv-conf {tls_keys[0]}: for the etcd backends (TCPStore has no TLS)"
            )
    elif conf.get("key") and not conf.get("cert"):
        raise UsageError("--rdzv-conf key: needs cert too")
    (host, port), *_ = members
    rdzv = RdzvSpec(
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
        endpoints=members,
        protocol=conf.get("protocol", "http"),
        cacert=conf.get("cacert"),
        cert=conf.get("cert"),
        key=conf.get("key"),
    )
    return rdzv, nodes, node_rank, standalone


def _one(
    endpoints: tuple[Endpoint, ...], text: Any, backend: str, default_port: int
) -> tuple[str, int]:
    """The one endpoint of a TCPStore backend, default_port where none is written."""
    if len(endpoints) != 1 or "," in str(text):
        raise UsageError(
            f"--rdzv-endpoint: the {backend} backend takes one HOST[:PORT], got {text!r} "
            "(only etcd takes a list)"
        )
    (host, port), *_ = endpoints
    return host, default_port if port is None else port


def _layout(checked: Mapping[str, Any], nodes: NodeRange) -> Layout:
    tp, pp, nproc = checked["tp"], checked["pp"], checked["nproc_per_node"]
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


def _faults(checked: Mapping[str, Any], conf_heartbeat_timeout: float) -> FaultSpec:
    interval = checked["heartbeat_interval"]
    given = checked["heartbeat_timeout"]
    timeout = conf_heartbeat_timeout if given is None else given
    if timeout <= interval:
        raise UsageError(
            f"--heartbeat-timeout={timeout:g} must be longer than --heartbeat-interval={interval:g}"
        )
    return from_values(FaultSpec, checked, heartbeat_timeout=timeout)


def _entrypoint(raw: Mapping[str, Any], checked: Mapping[str, Any]) -> EntryPoint:
    target = str(raw.get("training_script") or "").strip()
    if not target:
        raise UsageError("missing the training script (or module, with -m)")
    args = tuple(str(a) for a in raw.get("training_script_args") or ())
    module, no_python = checked["module"], checked["no_python"]
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if checked["run_path"] and (module or no_python):
        raise UsageError("--run-path cannot be combined with -m or --no-python")
    kind: EntryKind = "module" if module else "exec" if no_python else "script"
    return EntryPoint(kind=kind, target=target, args=args)
