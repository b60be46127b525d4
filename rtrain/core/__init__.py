"""rtrain.core: the pure library (config, rendezvous rules, layout, snapshots, health,
planner) and, in core/worker, the worker-side API that training scripts call:
`heartbeat(step)`, `topology()`, `snapshot(state, step)`, `restore()`,
`recycle_actions()` and `recycle_worker_plan()`, re-exported here.

Everything outside core/worker does no I/O, starts nothing and never sleeps
(tests/unit/test_layers.py checks it). Importing this package must stay cheap:
`rtrain --help` goes through it, so nothing here imports torch at module level.
"""

from . import worker as _worker
from .worker import *  # noqa: F403  (the worker API is rtrain.core's surface)

__all__ = list(_worker.__all__)
