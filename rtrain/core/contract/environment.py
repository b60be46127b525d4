"""The variables an agent sets for each worker beyond torchrun's (those, and how the
whole environment is built, are core/config/worker_env.py's), and the heartbeat file's
layout. The repair variables are core/contract/repair_files.py's."""

from __future__ import annotations

import struct

# The worker's generation (torchrun's TORCHELASTIC_RESTART_COUNT counts restarts only).
RTRAIN_GENERATION = "RTRAIN_GENERATION"
# Files and folders the agent hands each worker, read and written by rtrain.core.worker.
HEARTBEAT_FILE = "RTRAIN_HEARTBEAT_FILE"
TOPOLOGY_FILE = "RTRAIN_TOPOLOGY_FILE"
SNAPSHOT_DIR = "RTRAIN_SNAPSHOT_DIR"
SNAPSHOT_BUDGET = "RTRAIN_SNAPSHOT_BUDGET"  # bytes one slot may take
RECYCLE_PLAN_FILE = "RTRAIN_RECYCLE_PLAN"
# Where a worker's boot code writes its stack when the agent asks (a hang).
STACK_FILE = "RTRAIN_STACK_FILE"

# The heartbeat file: count (u64, bumped by every call), step (i64, -1 when not given).
HEARTBEAT_FORMAT = "<Qq"
HEARTBEAT_SIZE = struct.calcsize(HEARTBEAT_FORMAT)
