"""StalenessTracker: notice a value that stopped changing, on the observer's own clock.

Agent leases and worker heartbeats are both counters that their owner keeps bumping.
The store has no TTLs and the nodes' clocks are not synchronised, so an observer never
compares timestamps written by someone else: it only notes when it last saw each
counter change, and a counter unchanged for longer than the timeout is stale.

Pure: the caller hands in every observation and the time.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass
class _Seen:
    value: object
    changed_at: float


class StalenessTracker(Generic[Key]):
    """timeout: seconds without a change before a key is stale.

    armed_by_first_change: worker heartbeats count only once the worker has called
    heartbeat() at least once (its value moved from `initial`, the value its file starts
    with, even if that move happened before the first observation); leases count from
    the moment the observer starts watching, so a node that never heartbeats at all is
    caught too.
    """

    def __init__(
        self, timeout: float, armed_by_first_change: bool = False, initial: object = None
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = timeout
        self._armed_by_first_change = armed_by_first_change
        self._initial = initial
        self._seen: dict[Key, _Seen] = {}
        self._armed: set[Key] = set()

    def observe(self, key: Key, value: object, now: float) -> None:
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = _Seen(value, now)
            started = self._initial is not None and value != self._initial
            if not self._armed_by_first_change or started:
                self._armed.add(key)
        elif seen.value != value:
            seen.value, seen.changed_at = value, now
            self._armed.add(key)

    def silent_for(self, key: Key, now: float) -> float:
        seen = self._seen.get(key)
        return 0.0 if seen is None else now - seen.changed_at

    def stale(self, now: float) -> list[Key]:
        return [
            key
            for key, seen in self._seen.items()
            if key in self._armed and now - seen.changed_at > self.timeout
        ]

    def forget(self, key: Key) -> None:
        self._seen.pop(key, None)
        self._armed.discard(key)


# Each node's lease is judged by this many peers. Three, spread a third of the ring
# apart, so that no block of consecutive ranks smaller than a third of the job (a
# rack, a switch: ranks follow hosts) takes out every watcher of one of its own nodes.
LEASE_WATCHERS = 3


def watched_peers(node_rank: int, num_nodes: int, watchers: int = LEASE_WATCHERS) -> list[int]:
    """The peers whose leases node_rank judges, when judging costs a read per lease.

    Node r watches r + 1 + i * num_nodes // watchers (mod num_nodes) for each i, so
    every node has `watchers` watchers and each node reads `watchers` leases: O(1) per
    node and O(N) for the job, not O(N) per node. A small job (watchers + 1 nodes or
    fewer) watches everyone. Whoever finds a lease expired records the loss for all.
    """
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"node rank {node_rank} is not in a job of {num_nodes} nodes")
    if num_nodes <= watchers + 1:
        return [n for n in range(num_nodes) if n != node_rank]
    offsets = sorted({1 + i * num_nodes // watchers for i in range(watchers)})
    return [(node_rank + offset) % num_nodes for offset in offsets]
