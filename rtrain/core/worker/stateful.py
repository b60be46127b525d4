"""Stateful objects and DTensors in a snapshot: what goes in, and loading back in place.

What torch.distributed.checkpoint takes, snapshot() takes: nested dicts, lists and
tuples of tensors, DTensors and plain values, and `Stateful` objects (anything with
state_dict() and load_state_dict(): a module, an optimizer, an LR scheduler, a data
loader's position). A Stateful is kept as its state_dict(); restore(into=state) hands
the restored dict back to the same object's load_state_dict().

A DTensor is kept as its local shard plus its global shape, placements and mesh (the
mesh's ranks, shape and dimension names). It is rebuilt on a mesh equal to the one it
was saved on: one passed as restore(mesh=...), or one that a DTensor in `into` lives on
(a module's state_dict() shows its parameters' meshes without communicating), or,
for a 1-D mesh over the whole world (FSDP2's usual one), a mesh over the default
process group (DeviceMesh.from_group: no collective call). Any other mesh rtrain
cannot make alone: a DeviceMesh's sub-groups are made by a collective call on every
rank, so restore() says in one line to pass into= or mesh=. After the mesh changed (a
node lost, DP shrunk) its shards no longer fit the ranks; that is a resharding load,
which torch.distributed.checkpoint's planner does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..snapshots.format import SnapshotError
from ..snapshots.skeleton import DTensorRef, where_of


def is_stateful(value: Any) -> bool:
    """torch.distributed.checkpoint's Stateful protocol, without importing it."""
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


_LEAVES: set[type] = set()  # types never Stateful: plain values, torch's tensors


def state_of(value: Any) -> Any:
    """`value` with every Stateful in it replaced by its state_dict()."""
    if not _LEAVES:
        import torch

        _LEAVES.update((str, int, float, bool, bytes, type(None), torch.Tensor))
        _LEAVES.add(torch.nn.Parameter)
    return _state_of(value)


def _state_of(value: Any) -> Any:
    kind = type(value)
    if kind in _LEAVES:  # a tensor's failed getattr("state_dict") costs about 0.3 us
        return value
    if kind is dict:
        return {k: _state_of(v) for k, v in value.items()}
    if kind is list:
        return [_state_of(v) for v in value]
    if kind is tuple:
        return tuple(_state_of(v) for v in value)
    if is_stateful(value):
        return value.state_dict()
    return value


def meshes_in(value: Any) -> Iterator[Any]:
    """The device meshes the DTensors in `value` live on (Stateful objects included)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from meshes_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from meshes_in(item)
    elif _is_dtensor(value):
        yield value.device_mesh
    elif is_stateful(value):
        yield from meshes_in(value.state_dict())


def dtensor_builder(meshes: Iterable[Any]) -> Any:
    """read_shard's DTensor builder over these meshes (core/snapshots/format.py)."""
    known = list(meshes)

    def build(ref: DTensorRef, local: Any, where: str) -> Any:
        import torch
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        mesh = next((m for m in known if _same_mesh(ref, m)), None)
        if mesh is None:
            mesh = _world_mesh(ref)
            if mesh is not None:
                known.append(mesh)  # the state's other DTensors share it
        if mesh is None:
            raise SnapshotError(
                f"{where}: a DTensor saved on a mesh of ranks {list(ref.mesh_ranks)[:16]} "
                f"(shape {list(ref.mesh_shape)}) and no equal mesh given: pass the live "
                "state as restore(into=...) or the mesh as restore(mesh=...), since rtrain "
                "can make only a 1-D mesh over the whole world alone (any other needs a "
                "collective call on every rank); after the mesh changed, load through "
                "torch.distributed.checkpoint with rtrain's storage to reshard"
            )

        def placement(name: str) -> Any:
            if name == "R":
                return Replicate()
            if name.startswith("S"):
                return Shard(int(name[1:]))
            return Partial(name[2:])

        return DTensor.from_local(
            local,
            mesh,
            [placement(p) for p in ref.placements],
            run_check=False,
            shape=torch.Size(ref.shape),
            stride=ref.stride,
        )

    return build


def _world_mesh(ref: DTensorRef) -> Any:
    """A mesh equal to ref's over the default process group, where ref's is 1-D over
    every rank of the world in order; else None. No collective call: the group exists."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    if len(ref.mesh_shape) != 1 or tuple(ref.mesh_ranks) != tuple(range(world)):
        return None
    from torch.distributed.device_mesh import DeviceMesh

    group = dist.group.WORLD
    assert group is not None  # initialized
    mesh = DeviceMesh.from_group(group, ref.device, mesh_dim_names=ref.dim_names)
    return mesh if _same_mesh(ref, mesh) else None


def _same_mesh(ref: DTensorRef, mesh: Any) -> bool:
    names = mesh.mesh_dim_names
    return (
        mesh.device_type == ref.device
        and tuple(mesh.mesh.shape) == ref.mesh_shape
        and tuple(mesh.mesh.flatten().tolist()) == ref.mesh_ranks
        and (None if names is None else tuple(names)) == ref.dim_names
    )


def load_into(target: Any, value: Any, path: tuple[Any, ...] = ()) -> Any:
    """Load `value` (a restored state) into `target` (the live one) in place; what
    takes target's place in its parent: Stateful objects get load_state_dict(), tensors
    of the same shape and dtype are copied into, dicts and lists are filled item by
    item, and anything else is replaced."""
    import torch

    if is_stateful(target) and isinstance(value, dict):
        target.load_state_dict(value)
        return target
    if type(target) is dict and isinstance(value, dict):
        for key, item in value.items():
            target[key] = load_into(target[key], item, (*path, key)) if key in target else item
        return target
    if type(target) is list and isinstance(value, list) and len(target) == len(value):
        for index, item in enumerate(value):
            target[index] = load_into(target[index], item, (*path, index))
        return target
    if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
        # Any: DTensor's attributes, which a torch.Tensor annotation does not have.
        live_any: Any = target
        saved_any: Any = value
        live = live_any.to_local() if _is_dtensor(target) else target
        saved = saved_any.to_local() if _is_dtensor(value) else value
        if _is_dtensor(target) != _is_dtensor(value) or (
            _is_dtensor(target) and tuple(live_any.placements) != tuple(saved_any.placements)
        ):
            raise SnapshotError(
                f"{where_of(path)}: the snapshot's tensor and the live one are not "
                "placed alike (a DTensor and a plain tensor, or other placements)"
            )
        if live.shape == saved.shape and live.dtype == saved.dtype:
            with torch.no_grad():
                live.copy_(saved)
            return target
    return value


def _is_dtensor(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "DTensor" and kind.__module__.startswith("torch.distributed")
