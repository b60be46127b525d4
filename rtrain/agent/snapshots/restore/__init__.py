"""Restore: each generation's agreed restore (restorer.py) and its copies into the new
workers' slots (copies.py: local memory, peers, the disk checkpoint), the shards of
other ranks a worker's resharding load reads (shard_fetch.py, fetched on request:
fetcher.py, or ahead: prefetch.py), and the part that ties them for a run (side.py)."""
