"""In-memory snapshots, the agent's side: this node's slots in shared memory
(local_slots.py, shard_store.py, spare_pool.py), shards between agents through one
transport (peers/), replication to ring successors (replication/), the agreed restore
at each generation start (restore/), disk checkpoints as the last resort (disk/), the
job secret, and SnapshotService, which ties them for a run (service.py). Formats and
plans are pure: core/snapshots."""
