"""The records agents exchange through the store to agree on a restore. Pure.

At a generation start each node publishes its Inventory (the shards it holds, how far
its own workers got); after each attempt at the agreed plan it publishes a
RestoreOutcome (whether all its ranks got a copy, and which copies were unusable).
Like the rendezvous protocol's records, whatever is read back is validated: a value of
the wrong shape is a ProtocolError, never trusted and never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..rendezvous.protocol import PROTOCOL_VERSION, ProtocolError, json_object
from .restore_plan import Reached, ShardId, Written


@dataclass(frozen=True)
class Inventory:
    """What one node holds at a generation start, and how far its own workers got."""

    shards: tuple[ShardId, ...]  # its workers' slots and the replicas it keeps
    newest: int | None = None  # the newest step any of its own workers committed
    every_rank: bool = False  # every one of its workers had committed a snapshot
    # The save its workers were last restored to, as (the generation whose shards hold
    # it as written, its step): a resharding load of that step reads those shards.
    loaded: Written | None = None

    def reached(self, was_member: bool) -> Reached:
        return Reached(self.newest, self.every_rank, was_member)

    def encode(self) -> str:
        return json.dumps(
            {
                "v": PROTOCOL_VERSION,
                "shards": [_shard(s) for s in self.shards],
                "reached": self.newest,
                "every_rank": self.every_rank,
                "loaded": None if self.loaded is None else list(self.loaded),
            }
        )

    @classmethod
    def decode(cls, payload: bytes | str) -> Inventory:
        what = "shard inventory"
        data = _versioned(payload, what)
        shards = tuple(ShardId(*row) for row in _rows(data.get("shards"), 3, what, "shards"))
        newest, every = data.get("reached", -1), data.get("every_rank")
        if newest is not None and not _count(newest):
            raise ProtocolError(f"{what}: reached must be a step or null, got {newest!r}")
        if not isinstance(every, bool):
            raise ProtocolError(f"{what}: every_rank must be true or false")
        loaded = data.get("loaded")  # absent: nothing loaded (an agent's first start)
        if loaded is not None:
            (row,) = _rows([loaded], 2, what, "loaded")
            loaded = Written(*row)
        return cls(shards, newest, every, loaded)


@dataclass(frozen=True)
class RestoreOutcome:
    """How one node's attempt at the agreed plan went."""

    complete: bool  # every rank of the node got an intact copy
    bad: frozenset[tuple[ShardId, int]] = frozenset()  # (shard, holder) copies unusable

    def encode(self) -> str:
        bad = sorted([*_shard(s), node] for s, node in self.bad)
        return json.dumps({"v": PROTOCOL_VERSION, "complete": self.complete, "bad": bad})

    @classmethod
    def decode(cls, payload: bytes | str) -> RestoreOutcome:
        what = "restore outcome"
        data = _versioned(payload, what)
        complete = data.get("complete")
        if not isinstance(complete, bool):
            raise ProtocolError(f"{what}: complete must be true or false")
        rows = _rows(data.get("bad"), 4, what, "bad")
        return cls(complete, frozenset((ShardId(g, r, s), n) for g, r, s, n in rows))


def _shard(shard: ShardId) -> list[int]:
    return [shard.generation, shard.rank, shard.step]


def _versioned(payload: bytes | str, what: str) -> dict[str, Any]:
    data = json_object(payload, what)
    if data.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"{what}: protocol version {data.get('v')!r} is not {PROTOCOL_VERSION}")
    return data


def _rows(value: Any, width: int, what: str, field: str) -> list[tuple[int, ...]]:
    """A list of rows of `width` non-negative integers each."""
    if not isinstance(value, list):
        raise ProtocolError(f"{what}: {field} must be a list")
    rows = []
    for row in value:
        if not (isinstance(row, list) and len(row) == width and _all_counts(row)):
            raise ProtocolError(
                f"{what}: each of {field} must be {width} non-negative integers, "
                f"got {str(row)[:40]!r}"
            )
        rows.append(tuple(row))
    return rows


def _all_counts(values: Iterable[Any]) -> bool:
    return all(_count(v) for v in values)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
