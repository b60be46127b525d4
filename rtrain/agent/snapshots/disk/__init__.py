"""Disk checkpoints, the last resort when no copy of some shard survives in memory: the
signed layout in --checkpoint-dir, its writer and reader (checkpoints.py), and the
run's part with its save before a stop (save.py)."""
