"""In-memory snapshots, the agent's side: the shards in shared memory (shard_store.py),
the authenticated shard server and its client (peers/), background replication to ring
successors (replicator.py), the agreed restore at each generation start (restorer.py),
disk checkpoints as the last resort, and the job secret. Formats and plans are pure:
core/snapshots."""
