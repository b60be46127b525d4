"""Badput by cause: every second of a job's wall time put down to one cause, from
its agents' events (node.py defines the causes; job.py merges the nodes')."""
