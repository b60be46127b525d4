"""The skeleton of a shard: a state dict's structure and plain values, as tagged JSON.

Shards travel between nodes and sit in shared memory that other processes can write,
so reading one must never run code: no pickle. The skeleton holds only plain types,
each JSON value tagged where JSON alone would lose the type:

  None, bool, int, float (nan/inf too), str    as themselves
  list                                         a JSON list
  {"d": [[key, value], ...]}                   a dict (keys: any hashable plain value)
  {"u": [...]}                                 a tuple
  {"b": "<base64>"}                            bytes
  {"t": [dtype, shape, offset, nbytes]}        a torch tensor, its bytes in the data area
  {"n": [dtype, shape, offset, nbytes]}        a numpy array, likewise
  {"D": [local, shape, stride, placements,     a DTensor: its local shard ("t" body), the
         mesh_shape, mesh_ranks, dim_names,     global shape and stride, placements as
         device]}                               "R", "S<dim>" or "P:<op>", and its mesh

Decoding checks every node against this grammar and every tensor reference against the
shard's data area; anything else is a SnapshotError. Pure: no I/O, no torch import.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64
# The element types a tensor or array in a shard may have: nothing that holds objects.
TORCH_DTYPES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
NUMPY_DTYPES = {
    name: size for name, size in TORCH_DTYPES.items() if not name.startswith(("bfloat", "float8"))
}


class SkeletonError(ValueError):
    """A value that has no place in a skeleton, or bytes that are not one."""


@dataclass(frozen=True)
class TensorRef:
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    numpy: bool = False


PLACEMENT = re.compile(r"R|S[0-9]{1,2}|P:(sum|avg|max|min|product)")
MAX_MESH_RANKS = 1 << 20


@dataclass(frozen=True)
class DTensorRef:
    """A DTensor: this rank's local shard and what rebuilds the DTensor around it on
    an equal device mesh (the same ranks in the same shape, the same dimension names)."""

    local: TensorRef
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    placements: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    mesh_ranks: tuple[int, ...]  # the mesh's global ranks, flattened in row-major order
    dim_names: tuple[str, ...] | None
    device: str

    def body(self) -> list[Any]:
        local = self.local
        return [
            [local.dtype, list(local.shape), local.offset, local.nbytes],
            list(self.shape),
            list(self.stride),
            list(self.placements),
            list(self.mesh_shape),
            list(self.mesh_ranks),
            None if self.dim_names is None else list(self.dim_names),
            self.device,
        ]


def encode(
    value: Any, tensor_ref: Callable[[Any, Callable[[], str]], TensorRef | DTensorRef | None]
) -> bytes:
    """The skeleton of `value`; tensor_ref(value, where) turns a tensor (or array, or
    DTensor) into its reference and returns None for anything else (where() names it)."""
    return json.dumps(_encode(value, (), tensor_ref, 0), separators=(",", ":")).encode()


def where_of(path: tuple[Any, ...]) -> str:
    """model.layers[0].weight: the key path of a value, for messages."""
    text = ""
    for part in path:
        text += (
            f"[{part}]" if isinstance(part, int) and text else (f".{part}" if text else str(part))
        )
    return text or "state"


def _encode(value: Any, path: tuple[Any, ...], tensor_ref: Callable[..., Any], depth: int) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the common cases first: a state dict is mostly these, dicts and tensors
    if depth > MAX_DEPTH:
        raise SkeletonError(f"{where_of(path)}: nested deeper than {MAX_DEPTH} levels")
    if kind is dict:
        return {
            "d": [
                [
                    _encode(k, (*path, k), _no_tensors, depth + 1),
                    _encode(v, (*path, k), tensor_ref, depth + 1),
                ]
                for k, v in value.items()
            ]
        }
    if kind is list or kind is tuple:
        items = [_encode(v, (*path, i), tensor_ref, depth + 1) for i, v in enumerate(value)]
        return items if kind is list else {"u": items}
    if isinstance(value, str):
        return str(value)  # a str subclass keeps its text only
    if isinstance(value, int):
        return int(value)  # an IntEnum or numpy-like int subclass keeps its value only
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if kind.__module__ == "numpy" and kind.__name__ != "ndarray":
        return _encode(value.item(), path, tensor_ref, depth)  # a numpy scalar: its value
    ref = tensor_ref(value, lambda: where_of(path))
    if isinstance(ref, DTensorRef):
        return {"D": ref.body()}
    if ref is not None:
        tag = "n" if ref.numpy else "t"
        return {tag: [ref.dtype, list(ref.shape), ref.offset, ref.nbytes]}
    if isinstance(value, dict):
        return _encode(dict(value), path, tensor_ref, depth)  # an OrderedDict and the like
    if isinstance(value, (list, tuple)):
        return _encode(
            list(value) if isinstance(value, list) else tuple(value), path, tensor_ref, depth
        )
    raise SkeletonError(
        f"{where_of(path)}: a {kind.__name__} cannot be snapshotted (only tensors, "
        "DTensors, numpy arrays, Stateful objects, dicts, lists, tuples, str, bytes, int, "
        "float, bool and None)"
    )


def _no_tensors(value: Any, where: Callable[[], str]) -> None:
    if type(value).__name__ in ("Tensor", "Parameter", "ndarray"):
        raise SkeletonError(f"{where()}: a tensor cannot be a dict key")
    return None


def decode(raw: bytes, data_len: int) -> Any:
    """The skeleton in `raw`, checked; TensorRefs where the tensors go."""
    try:
        tree = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SkeletonError(f"not a skeleton ({str(exc)[:80]})") from None
    return _decode(tree, data_len, 0)


def _decode(node: Any, data_len: int, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise SkeletonError(f"nested deeper than {MAX_DEPTH} levels")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, data_len, depth + 1) for v in node]
    if not isinstance(node, dict) or len(node) != 1:
        raise SkeletonError("an object that is not one tagged value")
    ((tag, body),) = node.items()
    if tag == "d" and isinstance(body, list):
        result = {}
        for pair in body:
            if not isinstance(pair, list) or len(pair) != 2:
                raise SkeletonError("a dict item that is not a [key, value] pair")
            key = _decode(pair[0], data_len, depth + 1)
            try:
                result[key] = _decode(pair[1], data_len, depth + 1)
            except TypeError:
                raise SkeletonError("a dict key that is not hashable") from None
        return result
    if tag == "u" and isinstance(body, list):
        return tuple(_decode(v, data_len, depth + 1) for v in body)
    if tag == "b" and isinstance(body, str):
        try:
            return base64.b64decode(body, validate=True)
        except ValueError:
            raise SkeletonError("bytes that are not base64") from None
    if tag in ("t", "n"):
        return _tensor_ref(body, data_len, numpy=tag == "n")
    if tag == "D":
        return _dtensor_ref(body, data_len)
    raise SkeletonError(f"an unknown tag {tag[:20]!r}")


def _dtensor_ref(body: Any, data_len: int) -> DTensorRef:
    if not (isinstance(body, list) and len(body) == 8):
        raise SkeletonError("a DTensor reference that is not eight fields")
    local, shape, stride, placements, mesh_shape, ranks, names, device = body
    sizes = [shape, stride, mesh_shape]
    if not all(isinstance(v, list) and len(v) <= 64 and all(map(_count, v)) for v in sizes):
        raise SkeletonError("a DTensor shape, stride or mesh shape that is not a list of sizes")
    if len(shape) != len(stride) or not mesh_shape:
        raise SkeletonError("a DTensor whose stride or mesh does not match its shape")
    if not (isinstance(ranks, list) and len(ranks) <= MAX_MESH_RANKS and all(map(_count, ranks))):
        raise SkeletonError("a DTensor mesh whose ranks are not a list of ranks")
    if math.prod(mesh_shape) != len(ranks) or len(set(ranks)) != len(ranks):
        raise SkeletonError("a DTensor mesh whose ranks do not fill its shape once each")
    if not (
        isinstance(placements, list)
        and len(placements) == len(mesh_shape)
        and all(isinstance(p, str) and PLACEMENT.fullmatch(p) for p in placements)
    ):
        raise SkeletonError("DTensor placements that are not one R, S<dim> or P:<op> per mesh dim")
    if any(p.startswith("S") and int(p[1:]) >= len(shape) for p in placements):
        raise SkeletonError("a DTensor sharded on a dimension it does not have")
    if names is not None and not (
        isinstance(names, list)
        and len(names) == len(mesh_shape)
        and all(isinstance(n, str) and len(n) <= 256 for n in names)
    ):
        raise SkeletonError("DTensor mesh dimension names that are not one string per dim")
    if not (isinstance(device, str) and device.isidentifier() and len(device) <= 32):
        raise SkeletonError("a DTensor device type that is not a name")
    return DTensorRef(
        _tensor_ref(local, data_len, numpy=False),
        tuple(shape),
        tuple(stride),
        tuple(placements),
        tuple(mesh_shape),
        tuple(ranks),
        None if names is None else tuple(names),
        device,
    )


def _tensor_ref(body: Any, data_len: int, numpy: bool) -> TensorRef:
    if not (isinstance(body, list) and len(body) == 4):
        raise SkeletonError("a tensor reference that is not [dtype, shape, offset, nbytes]")
    dtype, shape, offset, nbytes = body
    sizes = NUMPY_DTYPES if numpy else TORCH_DTYPES
    if not isinstance(dtype, str) or dtype not in sizes:
        raise SkeletonError(f"a tensor of unknown dtype {str(dtype)[:20]!r}")
    if not (isinstance(shape, list) and all(_count(d) for d in shape) and len(shape) <= 64):
        raise SkeletonError("a tensor shape that is not a list of sizes")
    if not (_count(offset) and _count(nbytes)):
        raise SkeletonError("a tensor offset or size that is not a count")
    if math.prod(shape) * sizes[dtype] != nbytes or offset + nbytes > data_len:
        raise SkeletonError("a tensor reference that does not match the shard's data")
    return TensorRef(dtype, tuple(shape), offset, nbytes, numpy)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
