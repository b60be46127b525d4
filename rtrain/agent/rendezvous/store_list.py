"""StoreList: an append-only list in the store, read in one request while it is empty.

A ledger that is mostly empty (nodes lost in a generation, nodes that reported a
failure, addresses that ever failed) kept as one key per node costs a reader a request
per node on TCPStore, whose multi_get blocks on a missing key. Kept as a count and
numbered entries, it costs one request (the count) while it is empty, and one more for
entries not read before: an entry once written never changes, so each is read once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..store.kv import KeyValueStore, increment

logger = logging.getLogger(__name__)


class StoreList:
    def __init__(
        self, store: KeyValueStore, count_key: str, entry_key: Callable[[int], str]
    ) -> None:
        self._store = store
        self._count_key = count_key
        self._entry_key = entry_key
        self._read: dict[int, str | None] = {}

    def append(self, value: str) -> None:
        index = increment(self._store, self._count_key)
        self._store.set(self._entry_key(index), value)
        self._read[index] = value

    def entries(self) -> list[str]:
        """Every entry written so far, in order. An entry counted but not written yet
        (its writer is between its two requests) is left out, and read on a later call."""
        count = self._store.counter(self._count_key)
        missing = [i for i in range(1, count + 1) if self._read.get(i) is None]
        if missing:
            payloads = self._store.multi_get([self._entry_key(i) for i in missing])
            for index, payload in zip(missing, payloads, strict=True):
                self._read[index] = None if payload is None else _text(payload)
        return [v for i in range(1, count + 1) if (v := self._read.get(i)) is not None]


def _text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        logger.error("refusing a list entry that is not UTF-8 text")
        return ""  # read once; no caller takes "" for a node or an address
