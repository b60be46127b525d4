"""Asking this node's agent for other ranks' shards of the generation before this one.

A resharding load (torch.distributed.checkpoint after the mesh changed) needs chunks of
shards that other ranks wrote, held in peers' memory. The worker does not talk to
peers (it has no job secret to prove itself with): it asks its agent through two files
in its snapshot folder (core/contract/peer_shards.py), and the agent fetches each shard
from a holder, local memory first, verifies its checksums and puts it next to the
request. The agent picks the request up on its replicator's next pass (a few ms; 0.25 s
while this generation has written no snapshot). The shards themselves are read like
any other: a checked skeleton, no pickle.

As the workers start, the agent fetches the shards it expects the load to read
(agent/snapshots/restore/prefetch.py) and leaves each, verified, in the snapshot folder
as prefetched-r<R>-s<S>.shard: those are read from there, with no request (one still
marked .pending is on its way: waited for); only the others are asked for. The agent
removes them once a newer step is committed.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import time
from functools import partial
from typing import Any

from ..clock import wait_until
from ..contract.environment import SNAPSHOT_DIR
from ..contract.peer_shards import (
    FETCHED_NAME,
    MAX_RESPONSE,
    prefetched_name,
    request_path,
    response_path,
)
from ..snapshots.format import SnapshotError, read_shard

FETCH_TIMEOUT_S = 300.0


def fetch_previous_shards(
    step: int, ranks: list[int], timeout: float = FETCH_TIMEOUT_S
) -> dict[int, Any]:
    """rank -> (state, step) of the previous generation's shards of these ranks at
    `step`; SnapshotError naming the rank when no intact copy could be had."""
    directory = os.environ.get(SNAPSHOT_DIR)
    if not directory:
        raise SnapshotError("peers' shards can only be read under rtrain launch")
    found = _prefetched(directory, step, ranks, timeout)
    asked = sorted(set(ranks) - set(found))
    if asked:
        found.update(_ask(directory, step, asked, timeout))
    return found


def _prefetched(directory: str, step: int, ranks: list[int], timeout: float) -> dict[int, Any]:
    """The shards of these ranks the agent prefetched; one still on its way (its
    `.pending` marker is there) is waited for."""
    found: dict[int, Any] = {}
    for rank in sorted(set(ranks)):
        path = os.path.join(directory, prefetched_name(rank, step))
        if not wait_until(
            partial(_gone, f"{path}.pending"), timeout, 0.005, time.monotonic, time.sleep
        ):
            raise SnapshotError(f"the agent did not prefetch rank {rank}'s shard in {timeout:g}s")
        try:
            found[rank] = _read(path)
        except FileNotFoundError:  # not expected, could not be had, or removed: asked for
            continue
    return found


def _ask(directory: str, step: int, ranks: list[int], timeout: float) -> dict[int, Any]:
    """Ask the agent for these ranks' shards, and wait for its answer."""
    me = int(os.environ.get("RANK", "0"))
    token = secrets.token_hex(8)
    response = response_path(directory, me)
    with contextlib.suppress(FileNotFoundError):
        os.remove(response)
    temporary = request_path(directory, me) + ".tmp"
    with open(temporary, "w") as handle:
        json.dump({"id": token, "step": step, "ranks": sorted(set(ranks))}, handle)
    os.replace(temporary, request_path(directory, me))
    answer: dict[str, Any] = {}

    def answered() -> bool:
        try:
            with open(response, "rb") as handle:
                raw = json.loads(handle.read(MAX_RESPONSE))
        except (FileNotFoundError, ValueError):
            return False
        if isinstance(raw, dict) and raw.get("id") == token:
            answer.update(raw)
            return True
        return False

    if not wait_until(answered, timeout, 0.005, time.monotonic, time.sleep):
        raise SnapshotError(f"the agent did not fetch peers' shards within {timeout:g}s")
    os.remove(response)
    files, errors = answer.get("files"), answer.get("errors")
    if not isinstance(files, dict) or not isinstance(errors, dict):
        raise SnapshotError("the agent's answer to a shard fetch is malformed")
    found: dict[int, Any] = {}
    try:
        for rank in sorted(set(ranks)):
            name = files.get(str(rank))
            if not (isinstance(name, str) and FETCHED_NAME.fullmatch(name)):
                why = str(errors.get(str(rank), "no answer"))[:200]
                raise SnapshotError(
                    f"no intact copy of rank {rank}'s shard of step {step} survives: {why}"
                )
            found[rank] = _read(os.path.join(directory, name))
    finally:
        for name in files.values():
            if isinstance(name, str) and FETCHED_NAME.fullmatch(name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(directory, name))
    return found


def _gone(path: str) -> bool:
    return not os.path.exists(path)


def _read(path: str) -> Any:
    """The shard's state, its tensors views of a private mapping of the file: no copy,
    and the file can go at once (the mapping keeps its pages while tensors use it)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise SnapshotError(f"{os.path.basename(path)} is empty")
        buffer = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    return read_shard(buffer, copy=False)
