"""rtrain.core: pure logic (launch spec, store protocol, topology, failure records) and
the worker-side API that training scripts call: `heartbeat(step)`, `topology()`,
`snapshot(state, step)`, `restore()` and `recycle_actions()`.

Importing this package must stay cheap: `rtrain --help` goes through it, so nothing
here imports torch at module level.
"""

from rtrain.core.recycle_topology import recycle_actions
from rtrain.core.snapshot_api import SnapshotError, restore, snapshot
from rtrain.core.worker_api import WorkerTopology, heartbeat, topology

__all__ = [
    "SnapshotError",
    "WorkerTopology",
    "heartbeat",
    "recycle_actions",
    "restore",
    "snapshot",
    "topology",
]
