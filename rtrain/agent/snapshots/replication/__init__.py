"""Replication to peers: the Replicator's thread checksums each committed slot of this
node's workers and sends it to the ring successors (replicator.py, woken by the
workers' byte on the wake FIFO: wake_fifo.py), Replication points it at each
generation's successors (ring.py), and JobInterval agrees the adapt policy's job-wide
snapshot interval (interval.py)."""
