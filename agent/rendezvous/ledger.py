"""FailureLedger: what failed in each generation, who was charged, who is excluded.

Failure records per (generation, node), the first-reporter restart claim, lost-node
marks (first declarer wins) with a list of them that is read in one request while it
is empty, and each node address's failure count, which excludes a flapping node at
--max-node-failures.
"""

from __future__ import annotations

import logging

from ...core.errors import RtrainError
from ...core.rendezvous.failures import FailureKind, FailureRecord, RecordError, root_cause_first
from ...core.rendezvous.protocol import ProtocolError, StoreKeys, decode_int
from ..store.kv import KeyValueStore, decode_counter, increment, wrote

logger = logging.getLogger(__name__)


class FailureLedger:
    def __init__(self, store: KeyValueStore, keys: StoreKeys, max_node_failures: int) -> None:
        self._store = store
        self._keys = keys
        self._limit = max_node_failures
        # Entries of the lost lists read so far, per generation: an entry once written
        # never changes, so each is read once.
        self._lost_read: dict[int, dict[int, int | None]] = {}

    # -- records --

    def record_failure(self, record: FailureRecord) -> None:
        key = self._keys.failure_count(record.generation, record.node_rank)
        index = increment(self._store, key)
        self._store.set(
            self._keys.failure(record.generation, record.node_rank, index), record.encode()
        )

    def failures(self, generation: int, num_nodes: int) -> list[FailureRecord]:
        """Every node's records of `generation`, in two requests whatever the job's size
        (every count, then every record), not two per node."""
        count_keys = [self._keys.failure_count(generation, n) for n in range(num_nodes)]
        counts = [
            decode_counter(payload, key)
            for key, payload in zip(count_keys, self._store.multi_get(count_keys), strict=True)
        ]
        owners = [n for n in range(num_nodes) for _ in range(counts[n])]
        keys = [
            self._keys.failure(generation, n, i)
            for n in range(num_nodes)
            for i in range(1, counts[n] + 1)
        ]
        records: list[FailureRecord] = []
        for node, payload in zip(owners, self._store.multi_get(keys), strict=True):
            if payload is None:
                continue
            try:
                records.append(FailureRecord.decode(payload))
            except RecordError as exc:
                logger.error("refusing a failure record of node %d: %s", node, exc)
        return records

    def claim_restart(self, generation: int) -> bool:
        """True for the first agent to report a failure in this generation.

        A worker failure usually takes its peers on other nodes down with it (their
        collectives lose a partner); only the first reporter is charged the restart.
        """
        return increment(self._store, self._keys.restart_claim(generation)) == 1

    def charge_root_cause(self, generation: int, num_nodes: int, closer: str) -> None:
        """Charge the node at the root of `generation`'s failure, exactly once.

        Every member records its failures before it rejoins, so when the next round
        closes the records of everyone in it are there; the earliest one is the culprit
        (its peers failed because of it). Lost nodes were charged by whoever declared them.
        """
        records = [
            r for r in self.failures(generation, num_nodes) if r.kind != FailureKind.LOST_NODE
        ]
        if not records:
            return
        root = root_cause_first(records)[0]
        if wrote(self._store, self._keys.charged(generation), f"{closer}:{root.host}"):
            count = self.count_node_failure(root.host)
            logger.info("failure of generation %d charged to %s (%d)", generation, root.host, count)

    # -- lost nodes --

    def mark_lost(self, generation: int, node_rank: int, by_node: int) -> bool:
        """Declare node_rank's lease expired; True for the first agent to declare it.

        Every declarer also makes sure the node is on the generation's list, so that a
        first declarer that died between its mark and its entry leaves no loss unlisted
        (an entry twice is harmless: the list is read as a set)."""
        first = wrote(self._store, self._keys.lost(generation, node_rank), str(by_node))
        if node_rank not in self._lost_list(generation):
            index = increment(self._store, self._keys.lost_count(generation))
            self._store.set(self._keys.lost_entry(generation, index), str(node_rank))
            self._lost_read.setdefault(generation, {})[index] = node_rank
        return first

    def lost_nodes(self, generation: int, num_nodes: int) -> list[int]:
        """The node ranks declared lost in the generation, in ascending order: one request
        while none is (the list's length), whatever the job's size."""
        return sorted(n for n in self._lost_list(generation) if 0 <= n < num_nodes)

    def _lost_list(self, generation: int) -> set[int]:
        count = self._store.counter(self._keys.lost_count(generation))
        known = self._lost_read.setdefault(generation, {})
        # An entry counted but not written yet (its writer is between the two requests)
        # is read again on the next call.
        missing = [i for i in range(1, count + 1) if known.get(i) is None]
        if missing:
            keys = [self._keys.lost_entry(generation, i) for i in missing]
            for index, payload in zip(missing, self._store.multi_get(keys), strict=True):
                known[index] = self._lost_entry(payload)
        return {node for node in known.values() if node is not None}

    @staticmethod
    def _lost_entry(payload: bytes | None) -> int | None:
        if payload is None:
            return None
        try:
            return decode_int(payload, "entry of the lost-node list")
        except ProtocolError as exc:
            logger.error("refusing %s", exc)
            return -1  # read once, and never a node rank

    # -- flapping nodes --

    def count_node_failure(self, addr: str) -> int:
        return increment(self._store, self._keys.node_failures(addr))

    def node_failures(self, addr: str) -> int:
        return self._store.counter(self._keys.node_failures(addr))

    def is_excluded(self, addr: str) -> bool:
        """A flapping node: charged --max-node-failures failures (0 means never excluded)."""
        return self._limit > 0 and self.node_failures(addr) >= self._limit

    def raise_if_excluded(self, addr: str) -> None:
        if self.is_excluded(addr):
            raise RtrainError(
                f"this node ({addr}) is excluded from the job: it was lost, or the root cause "
                f"of a failure, {self._limit} times (--max-node-failures={self._limit})"
            )
