"""rtrain: a fault-tolerant launcher for distributed PyTorch training.

`import rtrain` gives a training script the worker API (rtrain.core.worker):
`rtrain.heartbeat(step)`, `rtrain.topology()`, `rtrain.snapshot(state, step)`,
`rtrain.restore()`, `rtrain.recycle_actions()`, `rtrain.recycle_worker_plan()`.
"""

__version__ = "0.1.0"

# The worker API, for `import rtrain` (setup.cfg reads __version__ above without importing).
from rtrain.core import worker as _worker
from rtrain.core.worker import *  # noqa: F403

__all__ = ["__version__", *_worker.__all__]
