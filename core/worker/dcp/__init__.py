"""torch.distributed.checkpoint storage over rtrain's in-memory snapshots.

    from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

    if restored_step() is not None:
        dcp.load(state, storage_reader=SnapshotReader())
    ...
    dcp.save(state, storage_writer=SnapshotWriter(step))

Importing it imports torch.distributed.checkpoint, which `rtrain.core` does not.
"""

from .storage import SnapshotReader, SnapshotWriter, restored_step

__all__ = ["SnapshotReader", "SnapshotWriter", "restored_step"]
