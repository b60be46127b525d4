"""The index of one torch.distributed.checkpoint save into rtrain's memory, as JSON.

DCP's own storage pickles its Metadata; a shard here comes back from shared memory or a
peer, where nothing is unpickled, so the coordinator writes what the Metadata is made
of as plain JSON into every writer's shard instead (any one surviving shard then
describes the whole save):

  {"format": "rtrain-dcp-1", "save_id": hex, "writers": W, "step": S,
   "items": [[writer, slot, fqn, offset, kind, chunk_offsets, chunk_sizes, dtype,
              size, requires_grad], ...],
   "planner_data": [[fqn, [path...]], ...] | null}

kind is "t" (a whole tensor), "s" (a shard of one) or "b" (a value DCP would pickle);
(writer, slot) says where its data is: item `slot` of writer `writer`'s shard. Reading
an index checks every field and every chunk against its tensor's size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..snapshots.format import SnapshotError
from ..snapshots.skeleton import TORCH_DTYPES

FORMAT = "rtrain-dcp-1"
MARK = "rtrain.dcp"  # the key that tells a DCP shard from a snapshot() one
KINDS = ("t", "s", "b")
MAX_ITEMS = 1 << 22
MAX_DIMS = 64


@dataclass(frozen=True)
class Location:
    """Where an item's data is: item `slot` of the shard that writer `writer` wrote."""

    writer: int
    slot: int


@dataclass(frozen=True)
class Item:
    writer: int
    slot: int
    fqn: str
    offset: tuple[int, ...] | None  # the chunk's MetadataIndex offset (None for values)
    kind: str
    chunk_offsets: tuple[int, ...] | None
    chunk_sizes: tuple[int, ...] | None
    dtype: str | None
    size: tuple[int, ...] | None  # the whole tensor's
    requires_grad: bool


@dataclass(frozen=True)
class SaveIndex:
    save_id: str
    writers: int
    step: int
    items: tuple[Item, ...]
    planner_data: tuple[tuple[str, tuple[Any, ...]], ...] | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "save_id": self.save_id,
                "writers": self.writers,
                "step": self.step,
                "items": [
                    [
                        i.writer,
                        i.slot,
                        i.fqn,
                        None if i.offset is None else list(i.offset),
                        i.kind,
                        None if i.chunk_offsets is None else list(i.chunk_offsets),
                        None if i.chunk_sizes is None else list(i.chunk_sizes),
                        i.dtype,
                        None if i.size is None else list(i.size),
                        i.requires_grad,
                    ]
                    for i in self.items
                ],
                "planner_data": None
                if self.planner_data is None
                else [[fqn, list(path)] for fqn, path in self.planner_data],
            },
            separators=(",", ":"),
        )


def dcp_mark(skeleton: Any) -> tuple[int, SaveIndex] | None:
    """(writer, index) of a shard's checked skeleton written by SnapshotWriter; None
    for a snapshot() shard; SnapshotError for a mark that does not fit its index."""
    mark = skeleton.get(MARK) if isinstance(skeleton, dict) else None
    if mark is None:
        return None
    if not (isinstance(mark, dict) and isinstance(skeleton.get("items"), dict)):
        raise SnapshotError("a DCP shard without its index or items")
    index = parse_index(mark.get("index"))
    writer: Any = mark.get("writer")
    if not (_count(writer) and writer < index.writers):
        raise SnapshotError("a DCP shard whose writer is not in its index")
    return writer, index


def parse_index(text: Any) -> SaveIndex:
    """The index in `text`, checked; SnapshotError for anything else."""
    if not isinstance(text, str):
        raise SnapshotError("a DCP index that is not text")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise SnapshotError("a DCP index that is not JSON") from None
    if not (isinstance(raw, dict) and raw.get("format") == FORMAT):
        raise SnapshotError(f"a DCP index that is not {FORMAT}")
    save_id: Any = raw.get("save_id")
    writers: Any = raw.get("writers")
    step: Any = raw.get("step")
    items: Any = raw.get("items")
    if not (isinstance(save_id, str) and 0 < len(save_id) <= 64 and save_id.isalnum()):
        raise SnapshotError("a DCP index without a save id")
    if not (_count(writers) and writers > 0 and _count(step)):
        raise SnapshotError("a DCP index whose writers or step are not counts")
    if not (isinstance(items, list) and len(items) <= MAX_ITEMS):
        raise SnapshotError("a DCP index whose items are not a list")
    parsed = tuple(_item(entry, writers) for entry in items)
    return SaveIndex(save_id, writers, step, parsed, _planner_data(raw.get("planner_data")))


def _item(entry: Any, writers: int) -> Item:
    if not (isinstance(entry, list) and len(entry) == 10):
        raise SnapshotError("a DCP index item that is not ten fields")
    writer, slot, fqn, offset, kind, offsets, sizes, dtype, size, grad = entry
    if not (_count(writer) and writer < writers and _count(slot)):
        raise SnapshotError("a DCP index item whose writer or slot is out of range")
    if not (isinstance(fqn, str) and len(fqn) <= 4096) or kind not in KINDS:
        raise SnapshotError("a DCP index item without a name or a kind")
    if not isinstance(grad, bool):
        raise SnapshotError(f"{fqn}: requires_grad that is not a bool")
    if kind == "b":
        if any(v is not None for v in (offset, offsets, sizes, dtype, size)):
            raise SnapshotError(f"{fqn}: a value with tensor fields")
        return Item(writer, slot, fqn, None, kind, None, None, None, None, grad)
    dims = [_sizes(v, fqn) for v in (offset, offsets, sizes, size)]
    if len({len(d) for d in dims}) != 1:
        raise SnapshotError(f"{fqn}: a chunk whose offsets, sizes and tensor differ in rank")
    offset_t, offsets_t, sizes_t, size_t = dims
    if offset_t != offsets_t or any(
        o + n > whole for o, n, whole in zip(offsets_t, sizes_t, size_t, strict=True)
    ):
        raise SnapshotError(f"{fqn}: a chunk that does not lie inside its tensor")
    if dtype not in TORCH_DTYPES:
        raise SnapshotError(f"{fqn}: a tensor of unknown dtype {str(dtype)[:20]!r}")
    return Item(writer, slot, fqn, offset_t, kind, offsets_t, sizes_t, dtype, size_t, grad)


def _sizes(value: Any, fqn: str) -> tuple[int, ...]:
    if not (isinstance(value, list) and len(value) <= MAX_DIMS and all(map(_count, value))):
        raise SnapshotError(f"{fqn}: a shape that is not a list of sizes")
    return tuple(value)


def _planner_data(raw: Any) -> tuple[tuple[str, tuple[Any, ...]], ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
        raise SnapshotError("DCP planner data that is not a list")
    found = []
    for pair in raw:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], list)
            and len(pair[1]) <= MAX_DIMS
            and all(isinstance(p, str) or _count(p) for p in pair[1])
        ):
            raise SnapshotError("DCP planner data that is not [name, [path...]] pairs")
        found.append((pair[0], tuple(pair[1])))
    return tuple(found)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
