"""JobFallback: repair in place turned off for the whole job, through the rendezvous
store, after FALLBACK_AFTER failed repairs.

The counting rule: a repair is the job's repair of one generation (every node parks its
survivors when that generation ends); it failed when some node had to stop a worker it
had asked to park (no answer within ACK_S, an abort that hung, the worker died or was
held) or kept none. It counts once, however many nodes failed in it: the first node to
fail it takes the generation's claim (r<g>/repair_failed) and adds 1 to the job's count
(repair_failures). The node whose addition reaches FALLBACK_AFTER writes the fallback
record (repair_fallback: the generation, its node rank, the failed generations). Every
node reads that one key when a generation ends, before it asks anyone to park: once it
is there, every node stops its workers as without repair in place. A node that parked
in the same generation as the one that wrote it (both read before it was written) goes
over with the next generation's end.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ...core.rendezvous.keys import StoreKeys
from ..store.kv import KeyValueStore, increment, wrote

logger = logging.getLogger(__name__)

FALLBACK_AFTER = 2  # failed repairs (generations) before the job stops repairing
MAX_RECORD = 1 << 16  # the record is a few dozen bytes; a larger one is not rtrain's


@dataclass(frozen=True)
class Fallback:
    generation: int  # the generation whose failed repair turned it on
    node_rank: int  # the node that counted that failure
    failed: tuple[int, ...]  # the generations whose repairs failed

    def encode(self) -> str:
        return json.dumps(
            {"generation": self.generation, "node": self.node_rank, "failed": list(self.failed)}
        )

    @classmethod
    def decode(cls, data: bytes) -> Fallback | None:
        """The record, or None for anything rtrain did not write."""
        if len(data) > MAX_RECORD:
            return None
        try:
            found = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(found, dict):
            return None
        generation, node, failed = (
            _count(found.get("generation")),
            _count(found.get("node")),
            found.get("failed"),
        )
        if generation is None or node is None or not isinstance(failed, list):
            return None
        counts = [_count(g) for g in failed]
        if None in counts:
            return None
        return cls(generation, node, tuple(g for g in counts if g is not None))


def _count(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok and isinstance(value, int) else None


class JobFallback:
    """The job's count of failed repairs and its fallback record, on the store."""

    def __init__(self, store: KeyValueStore, keys: StoreKeys) -> None:
        self._store = store
        self._keys = keys

    def read(self) -> Fallback | None:
        """The fallback record, if some node wrote it (one get). A record that is not
        rtrain's still turns repair off: the safe side is today's restart."""
        data = self._store.get(self._keys.repair_fallback)
        if data is None:
            return None
        found = Fallback.decode(data)
        if found is None:
            logger.error("repair in place: the store's fallback record is not rtrain's")
            return Fallback(0, 0, ())
        return found

    def failed(self, generation: int, node_rank: int) -> Fallback | None:
        """Count `generation`'s repair as failed (once for the job, whoever calls); the
        fallback record when this call wrote it."""
        keys = self._keys
        if increment(self._store, keys.repair_failed(generation)) != 1:
            return None  # another node counted this generation's failure
        count = increment(self._store, keys.repair_failures)
        self._store.set(keys.repair_failure(count), str(generation))
        logger.warning(
            "repair in place of generation %d failed (%d of %d before the job stops repairing)",
            generation,
            count,
            FALLBACK_AFTER,
        )
        if count < FALLBACK_AFTER:
            return None
        found = self._store.multi_get([keys.repair_failure(n) for n in range(1, count + 1)])
        failed = tuple(sorted({int(v) for v in found if v is not None and v.isdigit()}))
        record = Fallback(generation, node_rank, failed)
        return record if wrote(self._store, keys.repair_fallback, record.encode()) else None
