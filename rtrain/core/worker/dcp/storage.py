"""torch.distributed.checkpoint over rtrain's memory: a StorageWriter and a StorageReader.

  dcp.save(state, storage_writer=SnapshotWriter(step))   this step's snapshot, in memory
  dcp.load(state, storage_reader=SnapshotReader())       the step a restart restored

The writer puts this rank's items (tensor chunks and plain values) into its snapshot
slot, exactly as snapshot() does, so the agent checksums and replicates them to peers;
the coordinator's index of the whole save (core/contract/dcp_index.py) goes into every
rank's shard. The reader takes the index from the shard the agent restored for this
rank and the chunks from it, or, for chunks other ranks wrote, from their shards in
peers' memory (core/worker/peer_shards.py). DCP's planner decides which chunks each
rank reads, so a load onto fewer ranks with other shard boundaries (FSDP2 after a node
loss shrank DP) reshards, with no disk.

Values DCP would pickle (ints, strings, optimizer hyper-parameters) are kept as plain
values in the shard's skeleton, never as pickles; the reader gives the planner a
torch.save of the checked plain value, made in this process. A value with no plain
form is a SnapshotError naming it, at save.

The agents keep the shards a resharding load read, under the generation that wrote
them, until a newer step is restored, so a second failure before the first save after
that load reads the same save again (agent/snapshots: Inventory.loaded, written_in). The
save must be over the default process group.
"""

from __future__ import annotations

import dataclasses
import io
import secrets
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ...contract.dcp_index import MARK, Item, Location, SaveIndex, parse_index
from ...snapshots.format import SnapshotError
from ..peer_shards import FETCH_TIMEOUT_S, fetch_previous_shards
from ..snapshots import restore, snapshot, snapshots_kept

KIND = {WriteItemType.TENSOR: "t", WriteItemType.SHARD: "s", WriteItemType.BYTE_IO: "b"}


@dataclasses.dataclass(frozen=True)
class _Placed:
    """What the coordinator hands each writer with its plan."""

    index: str
    writer: int
    step: int  # the step the index was made for


class SnapshotWriter(StorageWriter):
    """dcp.save into this rank's snapshot slot for `step` (or dcp.save(...,
    checkpoint_id=step))."""

    def __init__(self, step: int | None = None) -> None:
        super().__init__()
        self.step = step

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self.step = _step_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            _step_of(checkpoint_id)
        except SnapshotError:
            return False
        return True

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.step is None:
            raise SnapshotError("SnapshotWriter needs the step: SnapshotWriter(step)")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        assert self.step is not None
        items = []
        for writer, plan in enumerate(plans):
            for slot, item in enumerate(plan.items):
                items.append(_describe(writer, slot, item))
        mappings: dict[str, Any] = {}
        for plan in plans:
            if isinstance(plan.planner_data, dict):
                mappings.update(plan.planner_data)
        planner_data = tuple((str(k), tuple(v)) for k, v in mappings.items()) or None
        index = SaveIndex(secrets.token_hex(8), len(plans), self.step, tuple(items), planner_data)
        text = index.to_json()
        return [
            dataclasses.replace(plan, storage_data=_Placed(text, writer, self.step))
            for writer, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        placed = plan.storage_data
        assert isinstance(placed, _Placed) and self.step is not None
        if dist.is_initialized() and dist.get_rank() != placed.writer:
            raise SnapshotError(
                "rtrain's DCP storage saves over the default process group only "
                f"(rank {dist.get_rank()} was writer {placed.writer})"
            )
        index = placed.index
        if placed.step != self.step:
            # DCP's plan caching (DefaultSavePlanner(enable_plan_caching=True)) hands
            # each rank the plan of the save that made the cache, index and all: the
            # same items, another step. The index names this save's step.
            old, new = f'"step":{placed.step},', f'"step":{self.step},'
            if old not in index:
                raise SnapshotError("a cached DCP plan whose index names no step")
            index = index.replace(old, new, 1)
        data: dict[int, Any] = {}
        results = []
        for slot, item in enumerate(plan.items):
            if item.type == WriteItemType.BYTE_IO:
                # The value itself, not the torch.save DCP would make of it: the shard's
                # skeleton keeps plain values, and refuses others by name at planning.
                lookup = getattr(planner, "lookup_object", None)
                if lookup is None:
                    raise SnapshotError(
                        "SnapshotWriter needs a planner with lookup_object (DCP's "
                        "DefaultSavePlanner or a subclass)"
                    )
                data[slot] = lookup(item.index)
                size = 0
            else:
                resolved = planner.resolve_data(item)
                assert isinstance(resolved, torch.Tensor)
                data[slot] = resolved.detach()
                size = resolved.numel() * resolved.element_size()
            results.append(WriteResult(item.index, size, Location(placed.writer, slot)))
        shard = {MARK: {"index": index, "writer": placed.writer}, "items": data}
        try:
            kept = snapshot(shard, self.step)
        except SnapshotError as exc:
            raise SnapshotError(_named(str(exc), plan)) from None
        if not kept and not snapshots_kept():
            raise SnapshotError("SnapshotWriter writes into rtrain's memory: run under rtrain")
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Nothing: every shard already carries the index."""

    def storage_meta(self) -> None:
        return None


class SnapshotReader(StorageReader):
    """dcp.load from the step the agent restored for this rank, resharding from peers'
    memory when the ranks' chunks moved."""

    def __init__(self, timeout: float = FETCH_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout = timeout
        self._index: SaveIndex | None = None
        self._index_text = ""
        self._shards: dict[int, dict[int, Any]] = {}  # writer -> its items
        self._locations: dict[MetadataIndex, Location] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self._index, self._shards, self._locations = None, {}, {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return checkpoint_id is None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # No copy: the chunks are copied once, into the planner's tensors.
        restored = restore(copy=False)
        if restored is None:
            raise SnapshotError(
                "no snapshot was restored for this rank: nothing to load (check "
                "rtrain.core.worker.dcp.restored_step() is not None first)"
            )
        state, step = restored
        writer, index, items = _dcp_shard(state, step, "this rank's restored shard")
        self._index, self._shards = index, {writer: items}
        self._index_text = state[MARK]["index"]
        metadata, self._locations = _metadata(index)
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self._index is not None
        wanted = {self._locations[item.storage_index].writer for item in plan.items}
        missing = sorted(wanted - set(self._shards))
        if missing:
            fetched = fetch_previous_shards(self._index.step, missing, self.timeout)
            for writer, (state, step) in fetched.items():
                known = (self._index_text, self._index)
                theirs, index, items = _dcp_shard(state, step, f"rank {writer}'s shard", known)
                if theirs != writer or index.save_id != self._index.save_id:
                    raise SnapshotError(
                        f"the shard held as rank {writer}'s of step {step} belongs to "
                        f"writer {theirs} of save {index.save_id}, not to this save: the "
                        "shards were relabelled since they were written (no save since "
                        "the last resharding load); refused"
                    )
                self._shards[writer] = items
        for item in plan.items:
            where = self._locations[item.storage_index]
            value = self._shards[where.writer].get(where.slot)
            if item.type == LoadItemType.BYTE_IO:
                buffer = io.BytesIO()
                torch.save(value, buffer)  # a checked plain value, pickled here
                buffer.seek(0)
                planner.load_bytes(item, buffer)
                continue
            if not isinstance(value, torch.Tensor):
                fqn = item.storage_index.fqn
                raise SnapshotError(f"{fqn}: its chunk is missing from the shard")
            source = value
            for dim, (start, length) in enumerate(
                zip(item.storage_offsets, item.lengths, strict=True)
            ):
                source = source.narrow(dim, start, length)
            target = planner.resolve_tensor(item).detach()
            if target.shape != source.shape:
                raise SnapshotError(
                    f"{item.dest_index.fqn}: a chunk of {list(source.shape)} for a target "
                    f"of {list(target.shape)}"
                )
            target.copy_(source)
            planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _named(message: str, plan: SavePlan) -> str:
    """A skeleton error names items[slot]: name the item's fully qualified name instead."""
    where, _, rest = message.partition(": ")
    parts = where.split("[", 1)
    if parts[0] == "items" and len(parts) == 2:
        slot = parts[1].split("]", 1)[0]
        if slot.isdigit() and int(slot) < len(plan.items):
            return f"{plan.items[int(slot)].index.fqn}: {rest}"
    return message


def restored_step() -> int | None:
    """The step of the DCP save the agent restored for this rank, or None (nothing to
    load: a fresh start, or not under rtrain)."""
    restored = restore()
    if restored is None or not isinstance(restored[0], dict) or MARK not in restored[0]:
        return None
    return restored[1]


def _describe(writer: int, slot: int, item: Any) -> Item:
    kind = KIND[item.type]
    grad = False
    if kind == "b":
        return Item(writer, slot, item.index.fqn, None, kind, None, None, None, None, grad)
    data = item.tensor_data
    assert data is not None
    properties = data.properties
    dtype = str(properties.dtype).removeprefix("torch.")
    return Item(
        writer,
        slot,
        item.index.fqn,
        tuple(item.index.offset) if item.index.offset is not None else tuple(data.chunk.offsets),
        kind,
        tuple(data.chunk.offsets),
        tuple(data.chunk.sizes),
        dtype,
        tuple(data.size),
        bool(properties.requires_grad),
    )


def _metadata(index: SaveIndex) -> tuple[Metadata, dict[MetadataIndex, Location]]:
    described: dict[str, Any] = {}
    locations: dict[MetadataIndex, Location] = {}
    for item in index.items:
        where = Location(item.writer, item.slot)
        if item.kind == "b":
            described[item.fqn] = BytesStorageMetadata()
            locations[MetadataIndex(item.fqn)] = where
            continue
        assert item.size is not None and item.chunk_offsets is not None and item.dtype
        assert item.chunk_sizes is not None
        tensor = described.setdefault(
            item.fqn,
            TensorStorageMetadata(
                TensorProperties(
                    dtype=getattr(torch, item.dtype), requires_grad=item.requires_grad
                ),
                torch.Size(item.size),
                [],
            ),
        )
        if not isinstance(tensor, TensorStorageMetadata) or tuple(tensor.size) != item.size:
            raise SnapshotError(f"{item.fqn}: chunks of different tensors under one name")
        tensor.chunks.append(
            ChunkStorageMetadata(torch.Size(item.chunk_offsets), torch.Size(item.chunk_sizes))
        )
        locations[MetadataIndex(item.fqn, torch.Size(item.chunk_offsets))] = where
    planner_data = None if index.planner_data is None else dict(index.planner_data)
    metadata = Metadata(described, planner_data=planner_data, storage_data=locations)
    return metadata, locations


def _dcp_shard(
    state: Any, step: int, what: str, known: tuple[str, SaveIndex] | None = None
) -> tuple[int, SaveIndex, dict[int, Any]]:
    """(writer, index, items) of a DCP shard; known: (text, index) of an index already
    read, taken as it is when this shard carries the same text (every shard of a save
    does: one parse per load, not one per shard read)."""
    mark = state.get(MARK) if isinstance(state, dict) else None
    if not isinstance(mark, dict) or not isinstance(state.get("items"), dict):
        raise SnapshotError(f"{what} of step {step} was not written by SnapshotWriter")
    text = mark.get("index")
    same = known is not None and isinstance(text, str) and text == known[0]
    index = known[1] if known is not None and same else parse_index(text)
    writer = mark.get("writer")
    if not (isinstance(writer, int) and 0 <= writer < index.writers and index.step == step):
        raise SnapshotError(f"{what} of step {step} does not match its own index")
    return writer, index, state["items"]


def _step_of(checkpoint_id: Any) -> int:
    text = str(checkpoint_id)
    if not text.isdigit():
        raise SnapshotError(f"a snapshot's checkpoint id is its step, not {text[:40]!r}")
    return int(text)
