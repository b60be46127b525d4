"""A new worker's watch while it starts up in a train-through generation.

Runs in the worker process, started by boot.py before the script: when the kept ranks
finish the training before this replacement is warm (its start-up slow, or hung), they
say so in the generation's store (core/contract/train_through.py), and the process
ends with success at once instead of holding the job's end until it would have been
ready. Once it says it is ready, or says anything in its control folder (it trains),
the watch ends: the worker's own wait (core/worker/repair/through.py) takes over.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from collections.abc import Mapping

from ...core.contract.environment import RTRAIN_GENERATION
from ...core.contract.repair_files import REPAIR_DIR, STATE_FILE
from ...core.contract.train_through import finished_key, joins_late, ready_key

POLL_S = 0.25
STORE_TIMEOUT_S = 30.0
ENDED = "rtrain: the kept ranks finished the training before this replacement was warm; it ends\n"


def watch_joiner(env: Mapping[str, str]) -> threading.Thread | None:
    """Start the watch for a new worker of a generation whose others were kept."""
    if not joins_late(env) or "MASTER_ADDR" not in env:
        return None
    thread = threading.Thread(target=_watch, args=(dict(env),), name="rtrain-joiner", daemon=True)
    thread.start()
    return thread


def _watch(env: dict[str, str]) -> None:
    generation, rank = int(env.get(RTRAIN_GENERATION, "0") or 0), int(env["RANK"])
    state = os.path.join(env.get(REPAIR_DIR, ""), STATE_FILE)
    store = None
    while True:
        time.sleep(POLL_S)
        if env.get(REPAIR_DIR) and os.path.exists(state):
            return  # it trains (or parked): not starting up any more
        with contextlib.suppress(Exception):  # a store not up yet, or gone: next time
            if store is None:
                import torch.distributed as dist  # here: the pool's worker has it already

                store = dist.TCPStore(
                    env["MASTER_ADDR"],
                    int(env["MASTER_PORT"]),
                    is_master=False,
                    timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
                    wait_for_workers=False,
                )
            if store.check([ready_key(generation, rank)]):
                return
            if store.check([finished_key(generation)]):
                os.write(2, ENDED.encode())
                os._exit(0)
