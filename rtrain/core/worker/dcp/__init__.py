"""torch.distributed.checkpoint storage over rtrain's in-memory snapshots.

    from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

    if restored_step() is not None:
        dcp.load(state, storage_reader=SnapshotReader())
    ...
    dcp.save(state, storage_writer=SnapshotWriter(step))

Importing the storage imports torch.distributed.checkpoint, which `rtrain.core` does
not; it is imported at the first use of these names, so the agent can read a save's
index (index.py, reads.py) without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .storage import SnapshotReader, SnapshotWriter, restored_step

__all__ = ["SnapshotReader", "SnapshotWriter", "restored_step"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import storage

        return getattr(storage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
