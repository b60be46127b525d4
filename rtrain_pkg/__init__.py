"""rtrain: a fault-tolerant launcher for distributed PyTorch training.

`import rtrain` gives a training script the worker API (rtrain.core.worker):
`rtrain.heartbeat(step)`, `rtrain.topology()`, `rtrain.snapshot(state, step)`,
`rtrain.restore()`, `rtrain.recycle_actions()`, `rtrain.recycle_worker_plan()`.
"""

__version__ = "0.1.0"

from rtrain.core.worker import (
    SnapshotError,
    WorkerPlan,
    WorkerTopology,
    heartbeat,
    recycle_actions,
    recycle_worker_plan,
    restore,
    snapshot,
    topology,
)

__all__ = [
    "SnapshotError",
    "WorkerPlan",
    "WorkerTopology",
    "__version__",
    "heartbeat",
    "recycle_actions",
    "recycle_worker_plan",
    "restore",
    "snapshot",
    "topology",
]
