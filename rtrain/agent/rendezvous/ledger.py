"""FailureLedger: what failed in each generation, who was charged, who is excluded.

Failure records per (generation, node), the first-reporter restart claim, lost-node
marks (first declarer wins), and each node address's failure count, which excludes a
flapping node at --max-node-failures. Who lost a node, who reported a failure and who
was ever charged one are also kept as StoreLists, so that a reader of a big job that
is mostly healthy pays one request, not one per node.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable, Collection

from ...core.errors import RtrainError
from ...core.rendezvous.decisions import failure_to_charge
from ...core.rendezvous.failures import FailureKind, FailureRecord, RecordError
from ...core.rendezvous.protocol import ProtocolError, StoreKeys, decode_int
from ..health.fault_history import FaultHistory
from ..observe.events import emit
from ..store.kv import KeyValueStore, decode_counter, increment, wrote
from .store_list import StoreList

logger = logging.getLogger(__name__)


class FailureLedger:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        max_node_failures: int,
        history: FaultHistory | None = None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._limit = max_node_failures
        self.history = history  # every charge is also a fault in the nodes' history
        self._lists: dict[str, StoreList] = {}  # kept: each keeps the entries it read
        self._refused: set[str] = set()
        self._failed_addrs = self._list(keys.failed_addrs_count, keys.failed_addr)

    def _list(self, count_key: str, entry_key: Callable[[int], str]) -> StoreList:
        if count_key not in self._lists:
            self._lists[count_key] = StoreList(self._store, count_key, entry_key)
        return self._lists[count_key]

    def _lost(self, generation: int) -> StoreList:
        return self._list(
            self._keys.lost_count(generation), functools.partial(self._keys.lost_entry, generation)
        )

    def _reporters(self, generation: int) -> StoreList:
        return self._list(
            self._keys.reporters_count(generation),
            functools.partial(self._keys.reporter, generation),
        )

    def _nodes_in(self, entries: StoreList, num_nodes: int, what: str) -> list[int]:
        nodes: set[int] = set()
        for entry in entries.entries():
            try:
                node = decode_int(entry.encode(), what)
            except ProtocolError as exc:
                if entry not in self._refused:  # once, not on every read of the list
                    self._refused.add(entry)
                    logger.error("refusing %s", exc)
                continue
            if 0 <= node < num_nodes:
                nodes.add(node)
        return sorted(nodes)

    # -- records --

    def record_failure(self, record: FailureRecord) -> None:
        key = self._keys.failure_count(record.generation, record.node_rank)
        index = increment(self._store, key)
        self._store.set(
            self._keys.failure(record.generation, record.node_rank, index), record.encode()
        )
        if index == 1:
            self._reporters(record.generation).append(str(record.node_rank))

    def failures(self, generation: int, num_nodes: int) -> list[FailureRecord]:
        """Every node's records of `generation`: the nodes that reported (one request while
        none did), their counts, then their records; not two requests per node."""
        nodes = self._nodes_in(self._reporters(generation), num_nodes, "entry of the reporters")
        if not nodes:
            return []
        count_keys = [self._keys.failure_count(generation, n) for n in nodes]
        counts = [
            decode_counter(payload, key)
            for key, payload in zip(count_keys, self._store.multi_get(count_keys), strict=True)
        ]
        owners = [n for n, count in zip(nodes, counts, strict=True) for _ in range(count)]
        keys = [
            self._keys.failure(generation, n, i)
            for n, count in zip(nodes, counts, strict=True)
            for i in range(1, count + 1)
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
        """Charge the node at the root of `generation`'s failure, once, if anyone
        (core.rendezvous.decisions.failure_to_charge: never a victim, nobody more after a
        loss, which its declarer charged).

        Every member records its failures before it rejoins, so when the next round
        closes the records of everyone in it are there; the earliest one that is not a
        victim is the culprit (its peers failed because of it).
        """
        records = self.failures(generation, num_nodes)
        if not records:
            return
        root = failure_to_charge(records, self.lost_nodes(generation, num_nodes))
        if root is not None and self._claim(self._keys.charged(generation), closer):
            self.charge(generation, root.host, "root cause", root.kind.value)

    def charge(
        self, generation: int, addr: str, why: str, kind: str = FailureKind.LOST_NODE.value
    ) -> bool:
        """Charge addr one failure toward --max-node-failures for `generation`: once,
        whoever calls and however often (True for the call that did). A charge's claim
        holds a value of its own call, so a caller repeating it is not a new charge."""
        if not self._claim(self._keys.charge_claim(generation, addr), why):
            return False
        count = self.count_node_failure(addr)
        self._store.set(self._keys.node_charge(addr, count), f"{why} in generation {generation}")
        logger.info(
            "failure of generation %d charged to %s (%s; %d charged so far)",
            generation,
            addr,
            why,
            count,
        )
        emit("charge", host=addr, why=why, from_generation=generation, failures=count)
        if self.history is not None:
            self.history.record(addr, kind)
        return True

    def _claim(self, key: str, holder: str) -> bool:
        """set_once with a value unique to this call: True only for the call whose write
        took (wrote() with the same value twice takes twice)."""
        return wrote(self._store, key, f"{holder} {secrets.token_hex(8)}")

    # -- lost nodes --

    def mark_lost(self, generation: int, node_rank: int, by_node: int) -> bool:
        """Declare node_rank's lease expired; True for the first agent to declare it.

        Every declarer also makes sure the node is on the generation's list, so that a
        first declarer that died between its mark and its entry leaves no loss unlisted
        (an entry twice is harmless: the list is read as a set)."""
        first = self._claim(self._keys.lost(generation, node_rank), str(by_node))
        if node_rank not in self.lost_nodes(generation, node_rank + 1):
            self._lost(generation).append(str(node_rank))
        return first

    def lost_nodes(self, generation: int, num_nodes: int) -> list[int]:
        """The node ranks declared lost in the generation, in ascending order: one request
        while none is, whatever the job's size."""
        return self._nodes_in(self._lost(generation), num_nodes, "entry of the lost-node list")

    # -- flapping nodes --

    def count_node_failure(self, addr: str) -> int:
        count = increment(self._store, self._keys.node_failures(addr))
        if count == 1:
            self._failed_addrs.append(addr)
        return count

    def node_failures(self, addr: str) -> int:
        return self._store.counter(self._keys.node_failures(addr))

    def is_excluded(self, addr: str) -> bool:
        """A flapping node: charged --max-node-failures failures (0 means never excluded)."""
        return self._limit > 0 and self.node_failures(addr) >= self._limit

    def excluded(self, addrs: Collection[str]) -> set[str]:
        """Which of addrs are excluded: one request while no node was ever charged a
        failure, two otherwise, however many addresses (a round's closer asks for all)."""
        return set(self._charged_counts(addrs, self._limit))

    def _charged_counts(self, addrs: Collection[str], at_least: int) -> dict[str, int]:
        if self._limit <= 0:
            return {}
        failed = sorted(set(self._failed_addrs.entries()) & set(addrs))
        if not failed:
            return {}
        keys = [self._keys.node_failures(addr) for addr in failed]
        counts = {
            addr: decode_counter(payload, key)
            for addr, key, payload in zip(failed, keys, self._store.multi_get(keys), strict=True)
        }
        return {addr: count for addr, count in counts.items() if count >= at_least}

    def exclusions(self, addrs: Collection[str]) -> dict[str, str]:
        """Each excluded address of addrs, and why: its charges, each said (the last
        few), and the limit; the requests of excluded() while none is excluded."""
        counts = self._charged_counts(addrs, self._limit)
        shown = {addr: list(range(max(count - 2, 1), count + 1)) for addr, count in counts.items()}
        keys = [self._keys.node_charge(addr, n) for addr in sorted(shown) for n in shown[addr]]
        said = dict(zip(keys, self._store.multi_get(keys), strict=True)) if keys else {}
        why: dict[str, str] = {}
        for addr in sorted(shown):
            charges = [
                (said.get(self._keys.node_charge(addr, n)) or b"?").decode(errors="replace")[:80]
                for n in shown[addr]
            ]
            more = "..., " if shown[addr][0] > 1 else ""
            what = f"{more}{', '.join(charges)}"
            why[addr] = (
                f"excluded from the job: charged {counts[addr]} failure(s) ({what}), "
                f"--max-node-failures={self._limit}"
            )
        return why

    def raise_if_excluded(self, addr: str) -> None:
        if self.is_excluded(addr):
            why = self.exclusions([addr]).get(addr, f"excluded (--max-node-failures={self._limit})")
            raise RtrainError(f"this node ({addr}) is {why}")
