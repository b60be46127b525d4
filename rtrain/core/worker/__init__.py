"""rtrain.core.worker: the calls a training script makes to rtrain.

heartbeat(step), topology(), snapshot(state, step), restore(), recycle_actions(),
recycle_worker_plan(), repairable(fn) (repair in place) and the data shares a
train-through job reroutes: data_ranks(), data_world_size(), average_gradients().
This package runs inside the workers: unlike the rest of core it reads the environment
the agent set, maps the files the agent made and waits for the agent's replicator. It
imports only core.
Re-exported as `rtrain.core` and `rtrain`.
"""

from .api import WorkerTopology, heartbeat, topology
from .recycle import WorkerPlan, recycle_actions, recycle_worker_plan
from .repair import RepairError, repairable, repairs
from .shares import average_gradients, data_ranks, data_world_size
from .snapshots import SnapshotError, restore, snapshot

__all__ = [
    "RepairError",
    "SnapshotError",
    "WorkerPlan",
    "WorkerTopology",
    "average_gradients",
    "data_ranks",
    "data_world_size",
    "heartbeat",
    "recycle_actions",
    "recycle_worker_plan",
    "repairable",
    "repairs",
    "restore",
    "snapshot",
    "topology",
]
