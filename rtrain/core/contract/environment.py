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
# How many logical data ranks each step of a data-parallel job has (rtrain.data_ranks()):
# the job's full size, --nnodes' maximum times the workers per node, whatever the size
# of the generation running (core/worker/shares.py).
DATA_WORLD = "RTRAIN_DATA_WORLD"
# A warm spare worker (rtrain launch --spares-per-node): its slot on the node. It runs
# the script's start-up ahead of any fault and waits, parked, at the entry of the
# repairable function for the resume that names the rank it takes
# (core/worker/repair/warm_spare.py). Its RANK is -1 and it has no MASTER_ADDR until then.
SPARE = "RTRAIN_SPARE"
# Where a worker's boot code writes its stack when the agent asks (a hang).
STACK_FILE = "RTRAIN_STACK_FILE"

# The heartbeat file: count (u64, bumped by every call), step (i64, -1 when not given).
HEARTBEAT_FORMAT = "<Qq"
HEARTBEAT_SIZE = struct.calcsize(HEARTBEAT_FORMAT)

# The ranks of this generation whose processes a repair in place kept alive, "0,2,3"
# (set by the agents for every worker of a generation after the first; empty: none was
# kept). A rank not in it is a new process. With rtrain.repairable(train_through=True)
# the kept ranks train on at once in a group of their own while the new ones start up
# (core/worker/repair/through.py).
KEPT_RANKS = "RTRAIN_KEPT_RANKS"
MAX_RANKS_TEXT = 1 << 20


def encode_ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in sorted(set(ranks)))


def decode_ranks(text: str | None) -> tuple[int, ...] | None:
    """The ranks of a KEPT_RANKS value; None when it is absent or not a list of ranks
    (refused, never guessed: the worker then trains as without train-through)."""
    if text is None or len(text) > MAX_RANKS_TEXT:
        return None
    if not text.strip():
        return ()
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(sorted({int(p) for p in parts}))
