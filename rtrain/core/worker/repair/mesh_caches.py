"""What DTensor keeps about a generation's device meshes, dropped when its group is.

torch.distributed.tensor caches, per process, the sharding it propagated for each op,
the redistribution plans and the mesh topologies, keyed by specs that hold the
DeviceMesh, and a DeviceMesh holds its ProcessGroup objects (its _pg_registry). A
worker repaired in place (rtrain.repairable) outlives its group: without this, the
first generation's mesh stays in those caches, its destroyed group and that group's
descriptors and threads with it, and, since a new mesh of the same ranks and layout
equals the old one, the next generation's DTensor ops get their output specs from the
cache: DTensors on the destroyed generation's mesh object (measured: Adam's moments
after the first repaired step, FSDP2 over gloo). DTensor's RNG tracker goes too: a
fresh process has none, and creates it (synchronised over the new group) at its first
random DTensor op.

Only what was imported is touched (a DDP worker never imports DTensor), and each cache
is looked up by name: one a torch release lacks is skipped. These are torch's private
caches, and this is the one module that names them: CHECKED_ON is the torch release
whose caches were read and counted (CACHES), and tests/unit/core/test_mesh_caches.py
fails on that release if one of them is renamed or gone.
"""

from __future__ import annotations

import sys
from typing import Any

TENSOR = "torch.distributed.tensor"
CHECKED_ON = (2, 13)  # the torch release (major, minor) whose private caches these are
CACHES = 6  # how many forget_meshes() clears there once DTensor is fully imported


def _clear(owner: Any, *path: str) -> bool:
    """owner.<path>.cache_clear(), if the attribute exists; whether it did."""
    found = owner
    for name in path:
        found = getattr(found, name, None)
        if found is None:
            return False
    clear = getattr(found, "cache_clear", None)
    if not callable(clear):
        return False
    clear()
    return True


def forget_meshes() -> int:
    """Drop every DTensor cache that can hold a device mesh (and so its process
    groups), and the RNG tracker; how many caches were cleared (0: DTensor unused)."""
    if TENSOR not in sys.modules:
        return 0
    import torch

    cleared = 0
    api = sys.modules.get(f"{TENSOR}._api")
    dispatcher = getattr(getattr(api, "DTensor", None), "_op_dispatcher", None)
    propagator = getattr(dispatcher, "sharding_propagator", None)
    if propagator is not None:
        cleared += _clear(propagator, "propagate_op_sharding")
        cleared += _clear(propagator, "_propagate_tensor_meta_cached")
    fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if callable(fast_path):
        fast_path()
        cleared += 1
    redistribute = sys.modules.get(f"{TENSOR}._redistribute")
    if redistribute is not None:
        cleared += _clear(redistribute, "_gen_transform_infos")
        planners = getattr(redistribute, "_planner_cache", None)
        if isinstance(planners, dict):
            planners.clear()
            cleared += 1
    collectives = sys.modules.get(f"{TENSOR}._collective_utils")
    if collectives is not None:
        cleared += _clear(collectives, "MeshTopoInfo", "build_from_mesh")
    random: Any = sys.modules.get(f"{TENSOR}._random")
    if random is not None and hasattr(random, "_rng_tracker"):
        random._rng_tracker = None
    return cleared
