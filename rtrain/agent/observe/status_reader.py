"""Reading a running job's state from its store for `rtrain status`: read-only, bounded.

The reader never writes: it does not create the round counter, join, or renew
anything, so a status request cannot change what the agents decide. Nor does it wake
them: over TCPStore its stores check a key before reading it and never compare-set,
which wakes every client waiting on the key (issue 32: a status request in an open
round had every waiting agent take the round for closed). Its requests do
not grow with the job's age or size beyond one request per list: the round, the
membership, the lost-node list, every node's status record in one multi_get, and the
failure ledger of the last FAILURE_GENERATIONS generations. Whatever is there that
rtrain did not write is refused with the key it was under.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...core.errors import ExitCode, RtrainError
from ...core.observe.status import JobStatus, failure_views, node_views
from ...core.rendezvous.failures import FailureRecord
from ...core.rendezvous.fault_history import FaultEntry, HistoryError, decode_history
from ...core.rendezvous.protocol import Membership, ProtocolError, StoreKeys, decode_int
from ..rendezvous.ledger import FailureLedger
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK

FAILURE_GENERATIONS = 5  # failures of older generations are not read (the report has them)
# Node ranks a ledger entry of an earlier generation may name: its membership is not read.
MAX_NODES = 1 << 16


class NoJob(RtrainError):
    """Nothing of the job under its keys: wrong --rdzv-id, or a job not started yet."""

    exit_code = ExitCode.JOB_FAILED


class CountingStore:
    """A KeyValueStore that counts the requests made through it, and refuses writes."""

    READS = ("get", "exists", "counter", "multi_get")

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in self.READS:
            raise AttributeError(f"the status reader does not {name}")
        call = getattr(self._store, name)

        def counted(*args: Any) -> Any:
            self.reads += 1
            return call(*args)

        return counted


def read_status(
    store: KeyValueStore, run_id: str, now: Callable[[], float] = SYSTEM_CLOCK.wall
) -> JobStatus:
    keys = StoreKeys(run_id)
    counting = CountingStore(store)
    kv: Any = counting
    payload = kv.get(keys.round)
    if payload is None:
        raise NoJob(f"no job {run_id!r} in this store (nothing under {keys.prefix}/)")
    current = _refusing(lambda: decode_int(payload, "round counter"), keys.round)
    membership = _membership(kv, keys, current)
    running = membership is not None
    joined = 0
    if membership is None:
        joined = kv.counter(keys.joins(current))
        if current > 0:
            membership = _membership(kv, keys, current - 1)
    ledger = FailureLedger(kv, keys, 0)
    nodes: tuple = ()
    failures: dict[int, Sequence[FailureRecord]] = {}
    newest = membership.generation if membership is not None else current
    if membership is not None:
        size = len(membership.members)
        lost = ledger.lost_nodes(membership.generation, size)
        status_keys = [keys.status(membership.generation, r) for r in range(size)]
        nodes = node_views(membership, kv.multi_get(status_keys), lost, now())
    first = max(0, newest - FAILURE_GENERATIONS + 1)
    for generation in range(first, newest + 1):
        found = ledger.failures(generation, MAX_NODES)
        if found:
            failures[generation] = found
    return JobStatus(
        run_id=run_id,
        round=current,
        generation=membership.generation if membership is not None else None,
        running=running,
        joined=joined,
        nodes=nodes,
        failures=failure_views(failures),
        failures_from=first,
        reads=counting.reads,
        fault_history=_fault_history(kv, keys),
    )


def _fault_history(kv: Any, keys: StoreKeys) -> tuple[FaultEntry, ...]:
    payload = kv.get(keys.fault_history)
    if payload is None:
        return ()
    try:
        return decode_history(payload)
    except HistoryError as exc:
        raise RtrainError(f"refusing the fault history under {keys.fault_history}: {exc}") from None


def _membership(kv: Any, keys: StoreKeys, generation: int) -> Membership | None:
    key = keys.closed(generation)
    payload = kv.get(key)
    if payload is None:
        return None
    return _refusing(lambda: Membership.decode(payload, generation), key)


def _refusing(decode: Callable[[], Any], key: str) -> Any:
    try:
        return decode()
    except ProtocolError as exc:
        raise RtrainError(f"refusing what is under {key}: {exc}") from None
