"""rtrain.core.worker: the calls a training script makes to rtrain.

heartbeat(step), topology(), snapshot(state, step), restore(), recycle_actions() and
recycle_worker_plan(). This package runs inside the workers: unlike the rest of core it
reads the environment the agent set, maps the files the agent made and waits for the
agent's replicator. It imports only core. Re-exported as `rtrain.core` and `rtrain`.
"""

from .api import WorkerTopology, heartbeat, topology
from .recycle import WorkerPlan, recycle_actions, recycle_worker_plan
from .snapshots import SnapshotError, restore, snapshot

__all__ = [
    "SnapshotError",
    "WorkerPlan",
    "WorkerTopology",
    "heartbeat",
    "recycle_actions",
    "recycle_worker_plan",
    "restore",
    "snapshot",
    "topology",
]
