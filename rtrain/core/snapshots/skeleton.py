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


# Stands for a plain value while a template is made (its JSON text is where the value
# goes); a state whose own strings make that text ambiguous gets no template.
_LEAF = "\ue000"
_LEAF_JSON = json.dumps(_LEAF)
_FLOAT_JSON = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def leaf_json(value: Any) -> str:
    """A plain value's JSON text as the skeleton holds it; a float comes as ("f", repr)
    (layout_reuse.leaf_value)."""
    if type(value) is tuple:
        text: str = value[1]
        return _FLOAT_JSON.get(text, text)
    return json.dumps(value)


@dataclass(frozen=True)
class Template:
    """A skeleton's text around its plain values (dict values, list and tuple items of
    the exact types str, int, bool, float and None, in the order the encoding meets them):
    pieces alternate fixed text and each value's JSON, fixed first and last. The same
    pieces with other values' JSON in their places are the skeleton of a state that
    differs from this one in those values only (core/snapshots/layout_reuse.py)."""

    pieces: tuple[str, ...]

    def with_values(
        self, values: list[Any], before: list[Any], capacity: int
    ) -> tuple[bytes, Template] | None:
        """(skeleton in `capacity` bytes, template) with `values` (as layout_reuse lists
        them) where `before` were; None if their number is not this template's or the
        text does not fit."""
        if len(values) != len(before) or 2 * len(values) + 1 != len(self.pieces):
            return None
        pieces = list(self.pieces)
        for index, (new, old) in enumerate(zip(values, before, strict=True)):
            if new != old:
                pieces[2 * index + 1] = leaf_json(new)
        meta = padded("".join(pieces).encode(), capacity)
        return None if meta is None else (meta, Template(tuple(pieces)))


def padded(raw: bytes, capacity: int) -> bytes | None:
    """A skeleton's bytes in `capacity` bytes, spaces after them (JSON ignores them);
    None if they do not fit."""
    return raw + b" " * (capacity - len(raw)) if len(raw) <= capacity else None


def encode_template(
    value: Any, tensor_ref: Callable[[Any, Callable[[], str]], TensorRef | DTensorRef | None]
) -> tuple[str, Template | None]:
    """The skeleton of `value` as text (not yet bytes), and its Template, or None where
    the state's own strings hold the stand-in (the text is right either way).
    tensor_ref(value, where) turns a tensor (or array, or DTensor) into its reference
    and returns None for anything else (where() names it)."""
    leaves: list[Any] = []
    tree = _encode(value, (), tensor_ref, 0, leaves)
    text = json.dumps(tree, separators=(",", ":"))
    fixed = text.split(_LEAF_JSON)
    if len(fixed) != len(leaves) + 1:
        filled = _filled(tree, iter(leaves))
        return json.dumps(filled, separators=(",", ":")), None
    pieces: list[str] = [fixed[0]]
    for leaf, after in zip(leaves, fixed[1:], strict=True):
        pieces.append(json.dumps(leaf))
        pieces.append(after)
    return "".join(pieces), Template(tuple(pieces))


def _filled(node: Any, leaves: Any) -> Any:
    """The tree with each stand-in (the object itself, not an equal string of the
    state's) replaced by the next plain value."""
    if node is _LEAF:
        return next(leaves)
    if type(node) is list:
        return [_filled(item, leaves) for item in node]
    if type(node) is dict:
        return {key: _filled(item, leaves) for key, item in node.items()}
    return node


def placement_name(placement: Any, ndim: int, place: Callable[[], str]) -> str:
    """A DTensor placement's name in a shard. Exact types only: _StridedShard (FSDP2
    over tensor parallel) is a Shard whose local data is not one slice of the tensor."""
    kind = type(placement).__name__
    if kind == "Replicate":
        return "R"
    if kind == "Shard":
        return f"S{placement.dim % ndim}"
    if kind == "Partial":
        return f"P:{placement.reduce_op}"
    raise SkeletonError(
        f"{place()}: a DTensor placed {placement} cannot be snapshotted (only Shard, "
        "Replicate and Partial placements); save it with torch.distributed.checkpoint "
        "and rtrain.core.worker.dcp.SnapshotWriter"
    )


def where_of(path: tuple[Any, ...]) -> str:
    """model.layers[0].weight: the key path of a value, for messages."""
    text = ""
    for part in path:
        text += (
            f"[{part}]" if isinstance(part, int) and text else (f".{part}" if text else str(part))
        )
    return text or "state"


def _encode(
    value: Any,
    path: tuple[Any, ...],
    tensor_ref: Callable[..., Any],
    depth: int,
    leaves: list[Any] | None = None,
) -> Any:
    """The JSON tree of `value`; with `leaves`, each plain value of an exact type in a
    value's place (not a key) is listed there and stands as _LEAF in the tree."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        # the common cases first: a state dict is mostly these, dicts and tensors
        if leaves is None:
            return value
        leaves.append(value)
        return _LEAF
    if depth > MAX_DEPTH:
        raise SkeletonError(f"{where_of(path)}: nested deeper than {MAX_DEPTH} levels")
    if kind is dict:
        return {
            "d": [
                [
                    _encode(k, (*path, k), _no_tensors, depth + 1),
                    _encode(v, (*path, k), tensor_ref, depth + 1, leaves),
                ]
                for k, v in value.items()
            ]
        }
    if kind is list or kind is tuple:
        items = [_encode(v, (*path, i), tensor_ref, depth + 1, leaves) for i, v in enumerate(value)]
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
        # an OrderedDict and the like (a module's state_dict())
        return _encode(dict(value), path, tensor_ref, depth, leaves)
    if isinstance(value, (list, tuple)):
        return _encode(
            list(value) if isinstance(value, list) else tuple(value),
            path,
            tensor_ref,
            depth,
            leaves,
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
