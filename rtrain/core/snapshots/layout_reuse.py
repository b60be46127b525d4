"""Reusing the last snapshot's layout while the state's structure is unchanged.

plan_shard (format.py) walks the state once per snapshot and writes its skeleton as
JSON: about 9 microseconds a tensor, which for a state of many small tensors costs as
much as copying them. A training state keeps its structure from step to step (the same
keys, tensors of the same dtypes, shapes and devices), so the tensors' offsets and the
shard's size are those of the last snapshot. Its plain values do change: a step count,
a learning rate a scheduler sets each step, a data position, DCP's index of the save.
Those are kept apart: the skeleton is then the last one with the changed values'
JSON put in their places (skeleton.Template), not a new layout.

signature() is the lean walk that tells: it lists the state's tensors (or DTensors'
local shards) in the order plan_shard lays them out, a signature of everything the
skeleton says about its structure, and the plain values (str, int, bool, float, None)
in the order the skeleton holds them. Two states with equal signatures have the same
skeleton but for those values; values compare equal exactly when their JSON text would
be the same (the types are in the signature: 1, 1.0 and True are not one value to a
shard; floats by their repr, as JSON writes them: -0.0 is not 0.0). Anything the lean
walk does not know (a numpy array, a subclass, an object) is None: plan_shard then lays
the state out in full. Pure: no I/O; torch is imported on first use.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any, NamedTuple

MAX_DEPTH = 64
# The plain values a skeleton holds as JSON values: kept apart from the structure
_PLAIN = frozenset((str, int, bool, float, type(None)))
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


class Found(NamedTuple):
    """What the lean walk found: the structure, the tensors and the plain values."""

    signature: list[Any]
    tensors: list[Any]
    values: list[Any]


def signature(state: Any) -> Found | None:
    """The signature, tensors and plain values of `state`, or None where plan_shard
    must decide."""
    _types()
    found = Found([], [], [])
    try:
        _walk(state, found.signature, found.tensors, found.values, 0)
    except _Unknown:
        return None
    return found


def leaf_value(value: Any) -> Any:
    """A plain value as signature() lists it: floats as their repr (-0.0 is not 0.0,
    and a NaN equals itself), the others as themselves."""
    return ("f", repr(value)) if type(value) is float else value


def _walk(value: Any, sig: list[Any], tensors: list[Any], values: list[Any], depth: int) -> None:
    # Hot path: a state of thousands of tensors spends most of this walk on its tensors
    # and small dicts, so a dict's or list's tensors and plain values are handled in its
    # own loop, not by a call each (about 1.5 us a tensor before, 0.6 after).
    kind = type(value)
    add = sig.append
    keep = values.append
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
            elif item_kind in _PLAIN:
                add(item_kind)
                keep(item if item_kind is not float else ("f", repr(item)))
            else:
                _walk(item, sig, tensors, values, depth + 1)
    elif kind is list or kind is tuple:
        if depth > MAX_DEPTH:
            raise _Unknown
        add((kind, len(value)))
        for item in value:
            item_kind = type(item)
            if item_kind in _TENSOR_TYPES:
                add((item.dtype, item.shape, item.device, item.layout))
                tensors.append(item)
            elif item_kind in _PLAIN:
                add(item_kind)
                keep(item if item_kind is not float else ("f", repr(item)))
            else:
                _walk(item, sig, tensors, values, depth + 1)
    elif kind in _TENSOR_TYPES:
        add((value.dtype, value.shape, value.device, value.layout))
        tensors.append(value)
    elif kind in _PLAIN:
        add(kind)
        keep(leaf_value(value))
    elif kind is bytes:
        add((kind, value))
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
