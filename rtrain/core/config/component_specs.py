"""Each component's part of the launch spec (torchtitan's per-component config): what
it reads, and nothing else, cut from the LaunchSpec once, where the agent is put
together. A component's tests build its part, not a whole command line's spec.

rendezvous_part  Rounds, RoundCloser, FailureLedger (agent/rendezvous/)
fault_part       FaultPolicy (agent/faults.py)
monitor_part     GenerationMonitor (agent/monitor.py)
observe_part     Observer (agent/observe/observer.py)
snapshot_part    SnapshotService (agent/snapshots/service.py)
"""

from __future__ import annotations

from dataclasses import dataclass

from .launch_spec import LaunchSpec, NodeRange, ObserveSpec, SnapshotSpec


@dataclass(frozen=True)
class RendezvousPart:
    """The rounds: who may close one and when, and how often a node may fail."""

    run_id: str
    nodes: NodeRange
    join_timeout: float
    last_call_timeout: float
    static: bool  # --rdzv-backend=static: node ranks are the requested ones
    max_node_failures: int
    # The fault history (core/rendezvous/fault_history.py): faults in a window that make
    # a node a standby (0: never), and the file in --checkpoint-dir that keeps it
    # across jobs (None: this job's store only); Slurm's node names, for --exclude.
    standby_after_faults: int = 0
    fault_window: float = 86400.0
    history_dir: str | None = None
    slurm_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FaultPart:
    """Restarts and lost peers: the budget, and how long a peer check may take."""

    max_restarts: int
    monitor_interval: float
    heartbeat_interval: float


@dataclass(frozen=True)
class MonitorPart:
    """What a running generation watches, and how often."""

    max_nodes: int
    monitor_interval: float
    heartbeat_interval: float
    stragglers: str = "detect"  # --stragglers
    replace_stragglers_after: float = 0.0  # --replace-stragglers-after (0: never)


@dataclass(frozen=True)
class ObservePart:
    """The agent's events and metrics, and what its first event says about the job."""

    observe: ObserveSpec
    run_id: str
    backend: str
    max_restarts: int


@dataclass(frozen=True)
class SnapshotPart:
    """The snapshot service's settings (agent/snapshots/service.py)."""

    snapshots: SnapshotSpec
    run_id: str


def rendezvous_part(spec: LaunchSpec) -> RendezvousPart:
    return RendezvousPart(
        run_id=spec.rdzv.run_id,
        nodes=spec.nodes,
        join_timeout=spec.rdzv.join_timeout,
        last_call_timeout=spec.rdzv.last_call_timeout,
        static=spec.rdzv.backend == "static",
        max_node_failures=spec.faults.max_node_failures,
        standby_after_faults=spec.faults.standby_after_faults,
        fault_window=spec.faults.fault_window,
        history_dir=spec.snapshots.checkpoint_dir,
        slurm_nodes=spec.slurm.nodes if spec.slurm is not None else (),
    )


def fault_part(spec: LaunchSpec) -> FaultPart:
    return FaultPart(spec.max_restarts, spec.monitor_interval, spec.faults.heartbeat_interval)


def monitor_part(spec: LaunchSpec) -> MonitorPart:
    return MonitorPart(
        spec.nodes.max_nodes,
        spec.monitor_interval,
        spec.faults.heartbeat_interval,
        spec.faults.stragglers,
        spec.faults.replace_stragglers_after,
    )


def observe_part(spec: LaunchSpec) -> ObservePart:
    return ObservePart(spec.observe, spec.rdzv.run_id, spec.rdzv.backend, spec.max_restarts)


def snapshot_part(spec: LaunchSpec) -> SnapshotPart:
    return SnapshotPart(spec.snapshots, spec.rdzv.run_id)


__all__ = [
    "FaultPart",
    "MonitorPart",
    "ObservePart",
    "RendezvousPart",
    "SnapshotPart",
    "fault_part",
    "monitor_part",
    "observe_part",
    "rendezvous_part",
    "snapshot_part",
]
