"""The byte layout of one shard: a training state dict in a flat, mappable buffer.

  [ header (64 bytes) | skeleton (tagged JSON) | tensor data, each 64-byte aligned ]

The skeleton is the state dict with every tensor replaced by a TensorRef (dtype, shape,
offset, size); everything else in it must be a plain value (core.snapshots.skeleton:
ints, floats, strings, bytes, nested dicts, lists and tuples). No pickle: a shard comes
from shared memory or a peer, and reading one must never run code. Tensors are copied
straight into the buffer, so writing a shard costs one memory copy of the tensor bytes.

The header's `state` field is written last: a shard whose writer died half-way stays
WRITING and is never read. Checksums are 64-bit XXH3 digests of the skeleton and of
each 8 MiB chunk of the data area (chunk_bounds), so they can be computed (and
verified) in parallel, and so that the data chunks of two shards with the same tensors
line up whatever their skeletons' lengths: DP replicas' shards differ only in the
chunks that hold per-rank state, and only those need to travel (agent/snapshots/
delta.py). XXH3
runs at memory speed (about 7 GB/s per core here, CRC-32 about 2): verifying a shard
must not cost more than reading it.

torch is imported inside the functions that need it: `rtrain.core` must stay cheap.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .chunks import CHUNK, chunk_bounds, chunk_digest, chunk_hasher  # noqa: F401
from .header import (  # noqa: F401  (re-exported: the shard's layout is read from here)
    COMMITTED,
    EMPTY,
    HEADER,
    HEADER_SIZE,
    INTERVAL_OFFSET,
    MAGIC,
    REPLICATE_US_OFFSET,
    REPLICATED_OFFSET,
    STATE_OFFSET,
    VERSION,
    WRITING,
    ShardHeader,
    header_misfit,
    interval_field,
    read_header,
    replicate_time,
    replicated_step,
    set_replicate_time,
    set_replicated,
    shard_gap,
    shard_interval,
    write_header,
)
from .layout_reuse import Found, signature
from .skeleton import (
    NUMPY_DTYPES,
    TORCH_DTYPES,
    DTensorRef,
    SkeletonError,
    Template,
    TensorRef,
    decode,
    encode_template,
    padded,
    placement_name,
    where_of,
)

ALIGN = 64
# A worker's slot files. With the wait policy (core/worker/snapshots.py) a node that
# dies leaves its step before its newest safe on its peers, and the ranks of a
# data-parallel job are at most a step apart: three slots keep that step on every
# survivor, whichever side of the dead node's newest step it is (two did not, when a
# survivor overwrote it while the dead node's newest replicas were still in flight).
SLOTS_PER_RANK = 3
# A FIFO in the slot folder: a worker writes a byte into it after each commit, so the
# agent's replicator takes the snapshot at once rather than at its next poll.
WAKE_FIFO = "wake"


DTYPE_NAMES: dict[Any, str] = {}  # torch.dtype -> its name in a shard, filled on first use


class SnapshotError(ValueError):
    """A state dict rtrain cannot snapshot, or a shard it must not trust."""


@dataclass
class ShardLayout:
    """What write_shard needs: the encoded skeleton, the tensors, and the total size;
    signature: what layout_reuse.py says of the state (None: it could not say)."""

    meta: bytes
    tensors: list[Any]
    refs: list[TensorRef]
    data_len: int
    signature: list[Any] | None = None
    # Every tensor lives on the host (no device copies): write_shard copies them all in
    # one batched call. A reused layout's tensors are on the devices the signature says.
    on_host: bool = False
    values: list[Any] | None = None  # the state's plain values (layout_reuse.py)
    template: Template | None = None  # the skeleton's text around them

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.meta) + self.data_len


def plan_shard(state: Any, previous: ShardLayout | None = None) -> ShardLayout:
    """Lay out a state dict; raise SnapshotError (naming the key) for what cannot be kept.
    A state whose structure is that of `previous` (layout_reuse.py) reuses its offsets
    and its skeleton, with the plain values that changed put in their places (within the
    skeleton's room: see meta_capacity); only its tensors are new."""
    found = signature(state)
    if found is not None and previous is not None and previous.signature == found.signature:
        reused = _reused(previous, found)
        if reused is not None:
            return reused
    layout = _plan(state)
    if found is not None:
        layout.signature, layout.values = found.signature, found.values
    return layout


def _reused(previous: ShardLayout, found: Found) -> ShardLayout | None:
    """`previous` for a state of its structure: its skeleton, or its text with the plain
    values that changed put in; None where they do not fit its room."""
    meta, template = previous.meta, previous.template
    if previous.values != found.values:
        if template is None or previous.values is None:
            return None
        filled = template.with_values(found.values, previous.values, len(meta))
        if filled is None:
            return None
        meta, template = filled
    return replace(
        previous, meta=meta, tensors=found.tensors, values=found.values, template=template
    )


def meta_capacity(length: int) -> int:
    """The room a skeleton of `length` bytes gets: about 3 % more (at least 256 bytes),
    so that plain values whose text grows (a step count's digits, a learning rate's)
    fit where the last ones were and the tensors stay where they are; rounded so the
    data area starts 64-byte aligned in the slot."""
    room = length + max(256, length // 32)
    return room + (-(HEADER_SIZE + room)) % ALIGN


def _plan(state: Any) -> ShardLayout:
    import numpy
    import torch

    if not DTYPE_NAMES:
        for name in TORCH_DTYPES:
            if hasattr(torch, name):
                DTYPE_NAMES[getattr(torch, name)] = name

    tensors: list[Any] = []
    refs: list[TensorRef] = []
    offset = 0

    def tensor_ref(value: Any, place: Callable[[], str]) -> TensorRef | DTensorRef | None:
        kind = type(value)
        is_array = kind is numpy.ndarray
        if is_array:
            if value.dtype.name not in NUMPY_DTYPES:
                raise SnapshotError(
                    f"{place()}: a numpy array of {value.dtype} cannot be snapshotted "
                    "(only numeric and bool arrays)"
                )
            value = torch.from_numpy(numpy.ascontiguousarray(value))
        elif kind is not torch.Tensor and kind is not torch.nn.Parameter:
            if not isinstance(value, torch.Tensor):
                return None
            if kind.__name__ == "DTensor" and kind.__module__.startswith("torch.distributed"):
                return dtensor_ref(value, place)
            # Another wrapper subclass: its bytes are not its data, and copying it into
            # a plain tensor fails half-way through the write.
            raise SnapshotError(
                f"{place()}: a {kind.__module__}.{kind.__name__} cannot be snapshotted "
                "(only tensors, DTensors and numpy arrays)"
            )
        return plain_ref(value, place, is_array)

    def dtensor_ref(value: Any, place: Callable[[], str]) -> DTensorRef:
        mesh = value.device_mesh
        names = mesh.mesh_dim_names
        return DTensorRef(
            plain_ref(value.to_local(), place, False),
            tuple(value.shape),
            tuple(value.stride()),
            tuple(placement_name(p, value.ndim, place) for p in value.placements),
            tuple(mesh.mesh.shape),
            tuple(mesh.mesh.flatten().tolist()),
            None if names is None else tuple(names),
            mesh.device_type,
        )

    def plain_ref(value: Any, place: Callable[[], str], is_array: bool) -> TensorRef:
        nonlocal offset
        if value.layout != torch.strided or value.device.type == "meta":
            raise SnapshotError(
                f"{place()}: a {value.layout} tensor on {value.device.type} cannot be "
                "snapshotted (only strided tensors with data)"
            )
        dtype = DTYPE_NAMES.get(value.dtype)
        if dtype is None:
            raise SnapshotError(f"{place()}: a {value.dtype} tensor cannot be snapshotted")
        nbytes = value.numel() * value.element_size()
        ref = TensorRef(dtype, tuple(value.shape), offset, nbytes, numpy=is_array)
        offset += -(-nbytes // ALIGN) * ALIGN
        tensors.append(value)
        refs.append(ref)
        return ref

    try:
        text, template = encode_template(state, tensor_ref)
    except SkeletonError as exc:
        raise SnapshotError(str(exc)) from None
    raw = text.encode()
    meta = padded(raw, meta_capacity(len(raw)))
    assert meta is not None  # the room is never less than the text
    on_host = all(tensor.device.type == "cpu" for tensor in tensors)
    return ShardLayout(meta, tensors, refs, offset, on_host=on_host, template=template)


# Builds the DTensor around a restored local shard: (reference, local tensor, key path).
DTensorBuilder = Callable[[DTensorRef, Any, str], Any]


def no_dtensors(ref: DTensorRef, local: Any, where: str) -> Any:
    raise SnapshotError(
        f"{where}: the snapshot holds a DTensor; restore it with restore(into=...) or "
        "restore(mesh=...), which rebuild it on the device mesh"
    )


class Copier(Protocol):
    """How write_shard copies each tensor into the slot (core/worker/device_copy.py:
    device tensors on a side stream), and waits for every copy before the commit."""

    def copy(self, target: Any, source: Any) -> None: ...

    def copy_host(self, targets: list[Any], sources: list[Any]) -> None:
        """Host tensors into their views, in one batched call."""
        ...

    def finish(self) -> None: ...


# write_shard's entry in `views` for the list of a layout's target views
TARGETS = ("targets",)


def write_shard(
    buffer: Any,
    layout: ShardLayout,
    step: int,
    interval: int = 0,
    views: dict[tuple[Any, ...], Any] | None = None,
    copier: Copier | None = None,
) -> None:
    """Copy the shard into `buffer` (a writable mapping of at least layout.size bytes).
    views: the buffer's views by (offset, size, dtype, shape), kept by the caller
    between writes into the same mapping (made here when missing); copier: see Copier (a plain
    copy_ by default); interval: written at INTERVAL_OFFSET."""
    import torch

    write_header(buffer, ShardHeader(WRITING, step, len(layout.meta), layout.data_len, -1))
    struct.pack_into("<qq", buffer, INTERVAL_OFFSET, interval, 0)
    meta_end = HEADER_SIZE + len(layout.meta)
    buffer[HEADER_SIZE:meta_end] = layout.meta
    if views is not None and len(views) > 4 * len(layout.refs) + 64:
        views.clear()  # views of layouts long gone
    with torch.no_grad():
        if copier is not None and layout.on_host and views is not None:
            # The usual step: an unchanged layout (the same refs) into the same slot. Its
            # views are listed once, and the copies go in one call (about 0.5 us a tensor
            # of Python and lookups saved, a tenth of a 3,000-tensor state's copy).
            entry = views.get(TARGETS)
            if entry is None or entry[0] is not layout.refs or entry[1] != meta_end:
                entry = _targets(buffer, layout, meta_end, views)
                views[TARGETS] = entry
            _, _, targets, copied = entry
            sources = layout.tensors
            copier.copy_host(targets, sources if copied is None else [sources[i] for i in copied])
        else:
            for tensor, ref in zip(layout.tensors, layout.refs, strict=True):
                if ref.nbytes == 0:
                    continue
                target = _view(buffer, meta_end, ref, tensor.dtype, views)
                if copier is None:
                    target.copy_(tensor)
                else:
                    copier.copy(target, tensor)
    if copier is not None:
        copier.finish()
    struct.pack_into("<I", buffer, STATE_OFFSET, COMMITTED)


def _view(
    buffer: Any, meta_end: int, ref: TensorRef, dtype: Any, views: dict[tuple[Any, ...], Any] | None
) -> Any:
    """The slot's bytes viewed as the tensor (its dtype and shape), kept by the caller:
    one copy_ a tensor, strided or not, from the host or a device, straight into the
    slot (a device tensor is not staged through .cpu())."""
    import torch

    where = (meta_end + ref.offset, ref.nbytes, dtype, ref.shape)
    target = None if views is None else views.get(where)
    if target is None:
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=where[1], offset=where[0])
        target = raw.view(dtype).view(ref.shape)
        if views is not None:
            views[where] = target
    return target


def _targets(
    buffer: Any, layout: ShardLayout, meta_end: int, views: dict[tuple[Any, ...], Any]
) -> tuple[list[TensorRef], int, list[Any], list[int] | None]:
    """(refs, meta_end, the views of the tensors with bytes, their indices or None when
    that is every tensor): write_shard's TARGETS entry for a layout."""
    copied = [i for i, ref in enumerate(layout.refs) if ref.nbytes]
    targets = [
        _view(buffer, meta_end, layout.refs[i], layout.tensors[i].dtype, views) for i in copied
    ]
    return layout.refs, meta_end, targets, None if len(copied) == len(layout.refs) else copied


def check_shard(buffer: Any, length: int | None = None) -> tuple[ShardHeader, Any]:
    """(header, skeleton) of the committed shard in buffer[:length] (all of it by
    default), after every check read_shard makes before it builds a tensor: its
    header fits, its skeleton decodes and every tensor lies inside its data. A
    SnapshotError says which failed. The agent runs it on a copy before a worker
    restores it: a copy the worker could not read is refused while another can be
    planned."""
    length = len(buffer) if length is None else min(length, len(buffer))
    header = read_header(buffer)
    if header is None or header.state != COMMITTED:
        raise SnapshotError("not a complete shard")
    why = header_misfit(header, length)
    if why is not None:
        raise SnapshotError(f"shard is truncated: {why}")
    try:
        skeleton = decode(
            bytes(buffer[HEADER_SIZE : HEADER_SIZE + header.meta_len]), header.data_len
        )
    except SkeletonError as exc:
        raise SnapshotError(f"shard skeleton refused: {exc}") from None
    return header, skeleton


def read_shard(
    buffer: Any, copy: bool = True, dtensor: DTensorBuilder = no_dtensors
) -> tuple[Any, int]:
    """(state dict, step) from a committed shard. Tensors are copied out of the buffer,
    or with copy=False are views of it (the buffer must then be writable and stay
    unchanged: core/worker/snapshots.py hands a private mapping of a file it never
    writes again). dtensor(ref, local, where) makes each DTensor of its local shard."""
    import torch

    header, skeleton = check_shard(buffer)
    meta_end = HEADER_SIZE + header.meta_len

    def build(value: Any, path: tuple[Any, ...] = ()) -> Any:
        if isinstance(value, DTensorRef):
            return dtensor(value, build(value.local), where_of(path))
        if isinstance(value, TensorRef):
            dtype = getattr(torch, value.dtype)
            if value.nbytes == 0:
                empty = torch.empty(value.shape, dtype=dtype)
                return empty.numpy() if value.numpy else empty
            with warnings.catch_warnings():
                # A read-only mapping is fine when the tensor is cloned at once.
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.frombuffer(
                    buffer, dtype=torch.uint8, count=value.nbytes, offset=meta_end + value.offset
                )
            tensor = (raw.clone() if copy else raw).view(dtype).reshape(value.shape)
            return tensor.numpy() if value.numpy else tensor
        if isinstance(value, dict):
            return {k: build(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [build(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(build(v, (*path, i)) for i, v in enumerate(value))
        return value

    return build(skeleton), header.step
