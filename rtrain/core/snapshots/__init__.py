"""Snapshots, the pure part: the shard byte layout and its JSON skeleton, which request
a shard server admits, and which copy each rank restores."""
