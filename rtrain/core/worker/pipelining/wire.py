"""Tensors between pipeline workers: a fixed-size header, then the data.

A ReCycle plan sends a micro-batch's activation to whichever worker runs its next
stage, so a receiver cannot know shapes in advance the way torch's PipelineStage does
(it infers them once, for one fixed peer per direction). Every transfer is therefore
two tagged point-to-point messages: an int64 header (dtype code, number of
dimensions, the dimensions) and the tensor. The header is checked before a buffer is
allocated for it: a peer's bad header is an error naming the peer, never a huge
allocation. Only tensors travel; nothing is pickled. The header lives on the data's
device, so that a backend for that device (NCCL for CUDA) carries both.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

MAX_DIMS = 8
HEADER_LEN = 2 + MAX_DIMS
# 16 GiB: far past any activation this runtime moves; a header asking more is garbage.
MAX_BYTES = 1 << 34
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)


class WireError(RuntimeError):
    """A peer sent a header this runtime did not write, or a tensor it cannot send."""


def header_of(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype not in DTYPES:
        raise WireError(f"cannot send a {tensor.dtype} tensor between stages")
    if tensor.dim() > MAX_DIMS:
        raise WireError(f"cannot send a tensor of {tensor.dim()} dimensions (at most {MAX_DIMS})")
    size = tensor.numel() * tensor.element_size()
    if size > MAX_BYTES:
        raise WireError(f"cannot send a {size}-byte tensor between stages (limit {MAX_BYTES})")
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[0] = DTYPES.index(tensor.dtype)
    header[1] = tensor.dim()
    if tensor.dim():
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    return header


def parse_header(header: torch.Tensor, peer: int) -> tuple[torch.dtype, tuple[int, ...]]:
    """(dtype, shape) of a received header; WireError naming the peer if it is not one."""
    values = [int(v) for v in header.tolist()]
    code, ndim, dims = values[0], values[1], values[2:]
    if not 0 <= code < len(DTYPES) or not 0 <= ndim <= MAX_DIMS:
        raise WireError(f"rank {peer} sent a tensor header this runtime did not write")
    shape = tuple(dims[:ndim])
    if any(d < 0 for d in shape) or any(dims[ndim:]):
        raise WireError(f"rank {peer} sent a tensor header this runtime did not write")
    size = math.prod(shape) * torch.empty((), dtype=DTYPES[code]).element_size()
    if size > MAX_BYTES:
        raise WireError(f"rank {peer} announced a {size}-byte tensor (limit {MAX_BYTES})")
    return DTYPES[code], shape


class Sent:
    """Sends in flight: their works, and the tensors they read until they are done."""

    def __init__(self) -> None:
        self._works: list[dist.Work] = []
        self._buffers: list[torch.Tensor] = []

    def send(self, tensor: torch.Tensor, peer: int, tag: int | None) -> None:
        """Start sending `tensor` to global rank `peer` (tag None: untagged, matched by
        order alone, as NCCL matches them)."""
        data = tensor.detach().contiguous()
        header = header_of(data).to(data.device)
        for buffer, part in ((header, _part(tag, 0)), (data, _part(tag, 1))):
            work = dist.isend(buffer, peer, tag=part)
            if work is not None:
                self._works.append(work)
            self._buffers.append(buffer)

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works.clear()
        self._buffers.clear()


def recv(peer: int, tag: int | None, device: torch.device) -> torch.Tensor:
    """The tensor global rank `peer` sent with `tag` (blocks until it is here)."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=device)
    dist.recv(header, peer, tag=_part(tag, 0))
    dtype, shape = parse_header(header, peer)
    data = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(data, peer, tag=_part(tag, 1))
    return data


def _part(tag: int | None, part: int) -> int:
    """The tag of a transfer's header (part 0) or data (1); untagged: 0 for both, which
    order keeps apart (the header is sent, and received, first)."""
    return 0 if tag is None else 2 * tag + part
