"""PeerFetcher: the agent's side of a worker's request for other ranks' shards.

A worker loading through torch.distributed.checkpoint after the mesh changed asks for
other writers' shards of the step it was restored to (core/worker/peer_shards.py: the
files and their format): the generation before this one's, or, after a second failure
before a save every rank has, those of the generation the save was written in, which
the agents keep until then (FetchContext.loaded). This node answers from what the
restore pooled: for each shard, every node that holds a copy, this one first. A copy
is verified against its checksums; a holder that is gone, stops mid-transfer or sends
a corrupt copy is passed over for the next. Requests are looked for on the
replicator's passes (no thread of its own while idle: every wakeup costs an idle agent
CPU); each one is served on a thread of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import threading

from ....core.clock import Clock
from ....core.contract.peer_shards import MAX_RESPONSE, request_path, response_path
from ....core.snapshots.restore_plan import ShardId
from ...observe.events import emit
from ...waiting import SYSTEM_CLOCK
from ..peers.wire import IO_TIMEOUT_S
from ..shard_store import ShardStore
from .prefetch import Prefetched, prefetch
from .shard_fetch import FetchContext, fetch_shard

logger = logging.getLogger(__name__)

MAX_RANKS = 1 << 16
TOKEN = re.compile(r"[0-9a-f]{1,32}")


class PeerFetcher:
    def __init__(self, store: ShardStore, clock: Clock = SYSTEM_CLOCK) -> None:
        """clock: what a fetch and a prefetch took."""
        self._store = store
        self._clock = clock
        self._context: FetchContext | None = None
        self._lock = threading.Lock()
        self._prefetched: Prefetched | None = None  # the last prefetch() started

    def follow(self, context: FetchContext | None) -> None:
        with self._lock:
            self._context = context

    def poll(self) -> None:
        """Serve any request a local worker has put down (one stat per local rank)."""
        with self._lock:
            context = self._context
        if context is None:
            return
        directory = self._store.snap_dir(context.generation)
        for rank in context.local_ranks:
            path = request_path(directory, rank)
            if not os.path.exists(path):
                continue
            taken = f"{path}.{secrets.token_hex(4)}"
            try:
                os.rename(path, taken)  # the request is ours alone from here
            except FileNotFoundError:
                continue
            worker = threading.Thread(
                target=self._serve,
                args=(context, directory, rank, taken),
                name=f"rtrain-fetch-{rank}",
                daemon=True,
            )
            worker.start()

    def _serve(self, context: FetchContext, directory: str, rank: int, path: str) -> None:
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_RESPONSE + 1)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        request = _parse_request(raw)
        if request is None:
            logger.error("rank %d asked for peers' shards with a malformed request", rank)
            return
        token, step, ranks = request
        started = self._clock.now()
        files: dict[str, str | None] = {}
        errors: dict[str, str] = {}
        for wanted in ranks:
            shard = ShardId(context.written_in(step), wanted, step)
            name = f"fetched-r{wanted}-s{step}-{token}.shard"
            try:
                error = self._fetch(context, shard, os.path.join(directory, name))
            except Exception as exc:  # the worker waits for an answer: it gets one
                logger.exception("fetching %s for rank %d", shard, rank)
                error = f"{type(exc).__name__}: {exc}"
            files[str(wanted)] = name if error is None else None
            if error is not None:
                errors[str(wanted)] = error
                logger.error("rank %d asked for %s: %s", rank, shard, error)
        seconds = self._clock.now() - started
        logger.info(
            "fetched %d of %d shards of step %d for rank %d in %.3fs",
            len(ranks) - len(errors),
            len(ranks),
            step,
            rank,
            seconds,
        )
        emit(
            "shard_request",
            rank=rank,
            step=step,
            shards=len(ranks),
            failed=len(errors),
            seconds=round(seconds, 6),
        )
        answer = response_path(directory, rank)
        with open(answer + ".tmp", "w") as handle:
            json.dump({"id": token, "files": files, "errors": errors}, handle)
        os.replace(answer + ".tmp", answer)

    def _fetch(self, context: FetchContext, shard: ShardId, target_path: str) -> str | None:
        """Put an intact copy of `shard` at target_path; None, or why none could be had.
        A copy prefetched for the workers is linked, not fetched again (one on its way
        is waited for)."""
        with self._lock:
            prefetched = self._prefetched
        if prefetched is not None and shard in prefetched.wanted:
            prefetched.finished.wait(IO_TIMEOUT_S)
            with contextlib.suppress(OSError):
                os.link(prefetched.wanted[shard], target_path)
                return None
        return fetch_shard(self._store, context, shard, target_path)[1]

    def prefetch(self) -> Prefetched | None:
        """Start fetching the shards this node's new workers' resharding load is
        expected to read (prefetch.py); what it does, or None (nothing to prefetch)."""
        with self._lock:
            context = self._context
        if context is None:
            return None
        done = prefetch(self._store, context, self._clock)
        with self._lock:
            self._prefetched = done
        return done

    def committed(self, step: int) -> None:
        """A local worker committed `step`: the prefetched shards of an older step are
        read (the load came before it) and their files go."""
        with self._lock:
            done = self._prefetched
            if done is None or step <= done.step:
                return
            self._prefetched = None
        done.finished.wait(IO_TIMEOUT_S)
        for path in done.wanted.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _parse_request(raw: bytes) -> tuple[str, int, list[int]] | None:
    try:
        request = json.loads(raw) if len(raw) <= MAX_RESPONSE else None
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    token, step, ranks = request.get("id"), request.get("step"), request.get("ranks")
    if not (isinstance(token, str) and TOKEN.fullmatch(token)):
        return None
    if not (type(step) is int and step >= 0 and isinstance(ranks, list)):
        return None
    if len(ranks) > MAX_RANKS or not all(type(r) is int and r >= 0 for r in ranks):
        return None
    return token, step, sorted(set(ranks))
