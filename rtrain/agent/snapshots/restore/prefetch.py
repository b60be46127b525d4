"""The shards a resharding load will read, fetched before the workers start.

After the restore put each new worker's own shard in its slot, the agent reads the DCP
save's index from those shards (every shard carries it: core/contract/dcp_index.py),
predicts which other writers' shards each of its new ranks will read in the new world
(core/snapshots/dcp_reads.py) and fetches them, all at once: a local copy is hard-linked,
a peer's received over TCP, each verified against its checksums and checked as the
worker will read it, and left in the generation's snapshot folder as
prefetched-r<R>-s<S>.shard (core/worker/peer_shards.py), where the workers' load finds
them with no request. A shard that could not be had (its holders gone) is left out:
the load asks for it on demand, as it would without the prefetch, and gets the same
copy or the same error. The transfers run beside the workers' start (a worker waits
for a file still marked pending). Nothing here is unpickled: the index is JSON in a checked
skeleton.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from dataclasses import dataclass, field

from ....core.clock import Clock
from ....core.contract.dcp_index import SaveIndex, dcp_mark
from ....core.contract.peer_shards import prefetched_name
from ....core.snapshots.dcp_reads import writers_read
from ....core.snapshots.format import SnapshotError, check_shard
from ....core.snapshots.restore_plan import ShardId
from ...observe.events import emit
from ...waiting import SYSTEM_CLOCK
from ..shard_store import ShardStore
from .shard_fetch import FetchContext, fetch_shard

logger = logging.getLogger(__name__)

MAX_PARALLEL = 4  # transfers at once: a handful of peers' shards per node


@dataclass
class Prefetched:
    """What a prefetch did: the files it left (shard -> path), how many shards it
    linked from local memory, received from peers, or could not have; finished is set
    once every transfer ended."""

    step: int
    wanted: dict[ShardId, str] = field(default_factory=dict)  # what it fetches, where to
    files: dict[ShardId, str] = field(default_factory=dict)  # the files it left
    local: int = 0
    fetched: int = 0
    failed: int = 0
    seconds: float = 0.0
    finished: threading.Event = field(default_factory=threading.Event)


def planned(store: ShardStore, context: FetchContext) -> tuple[int, dict[ShardId, str]] | None:
    """(the step, shard -> the file to leave it in) for the shards this node's new ranks
    are expected to read beyond their own; None when they restored no DCP save."""
    if context.world_size <= 0 or not context.local_ranks:
        return None
    directory = store.snap_dir(context.generation)
    step, save_id, wanted = None, None, set()
    for rank in context.local_ranks:
        found = _restored(os.path.join(directory, f"rank{rank}.slot0"))
        if found is None:
            return None
        own, index = found
        if save_id not in (None, index.save_id):
            logger.warning("this node's ranks restored shards of two saves: no prefetch")
            return None
        step, save_id = index.step, index.save_id
        wanted |= writers_read(index, rank, context.world_size) - {own}
    if step is None:
        return None
    generation = context.written_in(step)
    return step, {
        ShardId(generation, writer, step): os.path.join(directory, prefetched_name(writer, step))
        for writer in sorted(wanted)
    }


def _restored(path: str) -> tuple[int, SaveIndex] | None:
    """(writer, index) of the DCP shard restored into a new worker's slot, or None."""
    try:
        with open(path, "rb") as handle:
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        header, skeleton = check_shard(buffer)
        found = dcp_mark(skeleton)
    except SnapshotError as exc:
        logger.warning("no prefetch: the restored shard %s is refused (%s)", path, exc)
        return None
    finally:
        buffer.close()
    if found is None or found[1].step != header.step:
        return None
    return found


def prefetch(
    store: ShardStore, context: FetchContext, clock: Clock = SYSTEM_CLOCK
) -> Prefetched | None:
    """Start fetching the shards planned() names, MAX_PARALLEL at a time, and return:
    the workers start meanwhile (their imports, their process group and their model take
    longer than the transfers), and a worker that wants a shard still on its way waits
    for it (each file has a `.pending` marker, made here, until its transfer ends). A
    `prefetch` event says what it did. Each shard comes through shard_fetch.fetch_shard
    (holders in turn, verified); clock: what it took."""
    began = clock.now()
    plan = planned(store, context)
    if plan is None:
        return None
    step, files = plan
    done = Prefetched(step, dict(files))
    if not files:
        done.finished.set()
        return done
    for path in files.values():
        with open(pending(path), "wb"):
            pass
    transfers = _Transfers(store, context, done, began, clock)
    threading.Thread(target=transfers.run, name="rtrain-prefetch", daemon=True).start()
    return done


class _Transfers:
    """One prefetch's transfers, on threads of their own: what they left goes into
    `done`, which is finished once every one ended."""

    def __init__(
        self,
        store: ShardStore,
        context: FetchContext,
        done: Prefetched,
        began: float,
        clock: Clock,
    ) -> None:
        self._clock = clock
        self._store = store
        self._context = context
        self._done = done
        self._began = began
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(MAX_PARALLEL)

    def run(self) -> None:
        done = self._done
        threads = [
            threading.Thread(target=self._one, args=item, name=f"rtrain-prefetch-{item[0].rank}")
            for item in done.wanted.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.seconds = self._clock.now() - self._began
        done.finished.set()
        logger.info(
            "prefetched %d of %d shards of step %d for the resharding load (%d local, %d "
            "from peers) in %.3fs",
            len(done.files),
            len(done.wanted),
            done.step,
            done.local,
            done.fetched,
            done.seconds,
        )
        emit(
            "prefetch",
            step=done.step,
            shards=len(done.wanted),
            local=done.local,
            fetched=done.fetched,
            failed=done.failed,
            seconds=round(done.seconds, 6),
        )

    def _one(self, shard: ShardId, path: str) -> None:
        holder: int | None = None
        why: str | None = "not fetched"
        try:
            with self._slots:
                holder, why = fetch_shard(self._store, self._context, shard, f"{path}.part")
                if holder is not None:
                    os.replace(f"{path}.part", path)
        except Exception as exc:  # a prefetch only: the load asks again on demand
            logger.exception("prefetching %s", shard)
            holder, why = None, f"{type(exc).__name__}: {exc}"
        finally:
            if holder is None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f"{path}.part")
            with contextlib.suppress(FileNotFoundError):
                os.remove(pending(path))  # after the file: a worker then finds it or not
        if holder is None:
            logger.warning("could not prefetch %s (%s): the load asks for it", shard, why)
        with self._lock:
            if holder is None:
                self._done.failed += 1
            else:
                self._done.files[shard] = path
                self._done.local += holder == self._context.node_rank
                self._done.fetched += holder != self._context.node_rank


def pending(path: str) -> str:
    """The marker a prefetched file has while its transfer runs."""
    return f"{path}.pending"
