"""rtrain.core: pure logic (launch spec, store protocol, topology, failure records) and
the worker-side API that training scripts call: `heartbeat(step)`, `topology()`,
`snapshot(state, step)`, `restore()`, `recycle_actions()` and `recycle_worker_plan()`.

Importing this package must stay cheap: `rtrain --help` goes through it, so nothing
here imports torch at module level.
"""

from rtrain.core.recycle_topology import WorkerPlan, recycle_actions, recycle_worker_plan
from rtrain.core.snapshot_api import SnapshotError, restore, snapshot
from rtrain.core.worker_api import WorkerTopology, heartbeat, topology

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
