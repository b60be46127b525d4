"""A chunk of a saved tensor, read from another rank's shard file into the tensor a
resharding dcp.load wants it in (SnapshotReader.read_data).

The rows a rank reads of a tensor cut along dim 0 lie in one contiguous byte range of
the saved chunk; so does any chunk whose dims before its last partial one are a single
index each. Those bytes are read with preadv straight into the target's memory when it
is a contiguous CPU tensor of the saved dtype: one copy, from the page cache, and no
page faults of a mapping of the file. Anything else (a GPU target, another dtype, a
strided chunk) is read into a host buffer of the bytes it needs and copied from there.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...snapshots.format import SnapshotError
from ...snapshots.skeleton import TensorRef
from ..peer_shards import ShardFile


def byte_span(
    shape: tuple[int, ...], starts: tuple[int, ...], lengths: tuple[int, ...], itemsize: int
) -> tuple[int, int] | None:
    """(first byte, bytes) of the chunk [starts, starts + lengths) of a C-contiguous
    tensor of `shape`, or None when the chunk is not one contiguous range."""
    partial = [dim for dim, (n, whole) in enumerate(zip(lengths, shape, strict=True)) if n != whole]
    last = partial[-1] if partial else -1
    if any(lengths[dim] != 1 for dim in range(last)):
        return None
    stride, begin = itemsize, 0
    for dim in reversed(range(len(shape))):
        begin += starts[dim] * stride
        stride *= shape[dim]
    return begin, math.prod(lengths) * itemsize


def read_chunk(
    shard: ShardFile,
    ref: Any,
    starts: tuple[int, ...],
    lengths: tuple[int, ...],
    target: torch.Tensor,
    fqn: str,
) -> None:
    """Copy the chunk [starts, starts + lengths) of the tensor `ref` describes in
    `shard` into `target`; SnapshotError for a chunk that is missing, lies outside its
    saved tensor, or does not fit the target."""
    if not isinstance(ref, TensorRef):
        raise SnapshotError(f"{fqn}: its chunk is missing from the shard")
    shape = tuple(ref.shape)
    if (
        len(starts) != len(shape)
        or len(lengths) != len(shape)
        or any(
            start < 0 or length < 0 or start + length > whole
            for start, length, whole in zip(starts, lengths, shape, strict=True)
        )
    ):
        raise SnapshotError(f"{fqn}: a chunk that does not lie inside its saved tensor")
    if tuple(target.shape) != tuple(lengths):
        raise SnapshotError(
            f"{fqn}: a chunk of {list(lengths)} for a target of {list(target.shape)}"
        )
    dtype = getattr(torch, ref.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if math.prod(shape) * itemsize != ref.nbytes:
        raise SnapshotError(f"{fqn}: a saved tensor whose bytes do not fit its shape")
    if target.numel() == 0:
        return
    span = byte_span(shape, starts, lengths, itemsize)
    if span is not None:
        begin, nbytes = span
        memory = _memory_of(target, dtype)
        if memory is not None:
            shard.read_into(ref.offset + begin, memory)
            return
        source = _read(shard, ref.offset + begin, nbytes).view(dtype).reshape(lengths)
    else:
        source = _read(shard, ref.offset, ref.nbytes).view(dtype).reshape(shape)
        for dim, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            source = source.narrow(dim, start, length)
    target.copy_(source)


def _read(shard: ShardFile, offset: int, nbytes: int) -> torch.Tensor:
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    shard.read_into(offset, buffer.numpy().data)
    return buffer


def _memory_of(target: torch.Tensor, dtype: torch.dtype) -> memoryview | None:
    """The target's bytes, writable, when they can take the saved bytes as they are."""
    if (
        target.device.type != "cpu"
        or target.dtype != dtype
        or not target.is_contiguous()
        or target.is_conj()
        or target.is_neg()
        or type(target) is not torch.Tensor
    ):
        return None
    try:
        return target.reshape(-1).view(torch.uint8).numpy().data.cast("B")
    except (RuntimeError, TypeError, ValueError):
        return None
