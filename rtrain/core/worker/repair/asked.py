"""Whether the agent asked this worker to repair in place (set by repair.py's watcher
as it releases the group, cleared as each generation's training function starts).

A collective on the released group fails at once, but a wait of the worker's own does
not: a snapshot waiting for its last step's replication to a peer that is gone (a
standby lost as it took over) would hold the worker until the agent stops it as one
that did not park. Such waits end on this flag (core/worker/snapshots.py)."""

from __future__ import annotations

import threading

ASKED = threading.Event()
