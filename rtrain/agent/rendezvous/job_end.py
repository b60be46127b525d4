"""How a job ends, in the store: the exit barrier's counters and the abort record
(JobEndRecords). What one node does at the end is agent/ending.py's JobEnd."""

from __future__ import annotations

from collections.abc import Callable

from ...core.clock import Clock
from ...core.errors import RendezvousError
from ...core.rendezvous.protocol import AbortRecord, ProtocolError, StoreKeys
from ..store.kv import KeyValueStore, increment, wrote
from ..waiting import SYSTEM_CLOCK

# The abort record is read at most this often: every loop checks it on every pass (a
# waiting round at 20-100 ms), and an abort, the end of the job, can wait a second;
# on TCPStore each read is a request to the one store of the whole job.
ABORT_CHECK_S = 1.0


class JobAborted(Exception):
    def __init__(self, record: AbortRecord) -> None:
        super().__init__(record.reason)
        self.record = record


class JobEndRecords:
    """The store's side of a job's end: per generation, the nodes done and exited; for
    the job, the abort record (first writer wins) and its acknowledgements."""

    def __init__(self, store: KeyValueStore, keys: StoreKeys, clock: Clock = SYSTEM_CLOCK) -> None:
        self._abort_now: Callable[[], bytes | None] | None = None
        self._store = store
        self._keys = keys
        self._clock = clock
        self._next_abort_read = float("-inf")

    def mark_done(self, generation: int) -> None:
        increment(self._store, self._keys.done(generation))

    def done_count(self, generation: int) -> int:
        return self._store.counter(self._keys.done(generation))

    def mark_exited(self, generation: int) -> None:
        increment(self._store, self._keys.exited(generation))

    def exited_count(self, generation: int) -> int:
        return self._store.counter(self._keys.exited(generation))

    def ack_abort(self) -> None:
        increment(self._store, self._keys.abort_acks)

    def abort_acks(self) -> int:
        return self._store.counter(self._keys.abort_acks)

    def abort(self, record: AbortRecord) -> bool:
        """Write the abort record unless one exists; True if this call wrote it. The
        generation's news wakes its members, who would otherwise read the record only
        on their next sweep."""
        first = wrote(self._store, self._keys.abort, record.encode())
        self._store.set(self._keys.news(record.generation), "abort")
        return first

    def read_abort(self) -> AbortRecord | None:
        payload = self._store.get(self._keys.abort)
        if payload is None:
            return None
        try:
            return AbortRecord.decode(payload)
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's abort key in the store: {exc}") from None

    def raise_if_aborted(self) -> None:
        """Checked on every pass of every loop, read at most every ABORT_CHECK_S: through
        the store's watch of the abort key where it has one (etcd: no store traffic)."""
        if self._clock.now() < self._next_abort_read:
            return
        self._next_abort_read = self._clock.now() + ABORT_CHECK_S
        if self._abort_now is None:
            self._abort_now = self._store.follow(self._keys.abort)
        if self._abort_now() is not None:
            record = self.read_abort()
            if record is not None:
                raise JobAborted(record)
