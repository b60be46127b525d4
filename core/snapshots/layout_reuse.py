"""Reusing the last snapshot's layout while the state's structure is unchanged.

plan_shard (format.py) walks the state once per snapshot and writes its skeleton as
JSON: about 9 microseconds a tensor, which for a state of many small tensors costs as
much as copying them. A training state keeps its structure from step to step (the same
keys, tensors of the same dtypes, shapes and devices, the same plain values), so the
skeleton, the tensors' offsets and the shard's size are those of the last snapshot.

signature() is the lean walk that tells: it lists the state's tensors (or DTensors'
local shards) in the order plan_shard lays them out, and a signature of everything the
skeleton says about them, which compares equal exactly when the skeleton's text would
be the same (the types of plain values are in it: 1, 1.0 and True are not one value to
a shard; floats by their repr, as JSON writes them: -0.0 is not 0.0). Anything
the lean walk does not know (a numpy array, a subclass, an object) is None: plan_shard
then lays the state out in full. Pure: no I/O; torch is imported on first use.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

MAX_DEPTH = 64
_TENSOR_TYPES: tuple[type, ...] = ()
_DTENSOR: type | None = None


def _types() -> None:
    """torch's tensor types; DTensor only once something imported it (importing it here
    costs seconds, and without it no state holds one)."""
    global _TENSOR_TYPES, _DTENSOR
    if not _TENSOR_TYPES:
        import torch

        _TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
    if _DTENSOR is None:
        _DTENSOR = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


class _Unknown(Exception):
    """A value the lean walk leaves to plan_shard."""


def signature(state: Any) -> tuple[list[Any], list[Any]] | None:
    """(signature, tensors) of `state`, or None where plan_shard must decide."""
    _types()
    sig: list[Any] = []
    tensors: list[Any] = []
    try:
        _walk(state, sig, tensors, 0)
    except _Unknown:
        return None
    return sig, tensors


def _walk(value: Any, sig: list[Any], tensors: list[Any], depth: int) -> None:
    # Hot path: a state of thousands of tensors spends most of this walk on its tensors
    # and small dicts, so a dict's or list's tensors and strings are handled in its own
    # loop, not by a call each (about 1.5 us a tensor before, 0.6 after).
    kind = type(value)
    add = sig.append
    if kind is dict or kind is OrderedDict:  # a module's state_dict() is the second
        if depth > MAX_DEPTH:
            raise _Unknown
        add((dict, len(value)))
        for key, item in value.items():
            key_kind = type(key)
            if key_kind is str:
                add(key)
            elif key_kind is int or key_kind is bool:
                add((key_kind, key))
            else:
                raise _Unknown
            item_kind = type(item)
            if item_kind in _TENSOR_TYPES:
                add((item.dtype, item.shape, item.device, item.layout))
                tensors.append(item)
            elif item_kind is str or item is None:
                add(item)
            elif item_kind is int:
                add((int, item))
            else:
                _walk(item, sig, tensors, depth + 1)
    elif kind is list or kind is tuple:
        if depth > MAX_DEPTH:
            raise _Unknown
        add((kind, len(value)))
        for item in value:
            item_kind = type(item)
            if item_kind in _TENSOR_TYPES:
                add((item.dtype, item.shape, item.device, item.layout))
                tensors.append(item)
            elif item_kind is str or item is None:
                add(item)
            elif item_kind is int:
                add((int, item))
            else:
                _walk(item, sig, tensors, depth + 1)
    elif kind in _TENSOR_TYPES:
        add((value.dtype, value.shape, value.device, value.layout))
        tensors.append(value)
    elif kind is str or value is None:
        add(value)
    elif kind is int or kind is bool or kind is bytes:
        add((kind, value))
    elif kind is float:
        add((kind, repr(value)))
    elif kind is _DTENSOR:
        local = value.to_local()
        add(
            (
                _DTENSOR,
                value.device_mesh,
                tuple(value.placements),
                value.shape,
                value.stride(),
                local.dtype,
                local.shape,
                local.device,
                local.layout,
            )
        )
        tensors.append(local)
    else:
        raise _Unknown
