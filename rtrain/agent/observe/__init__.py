"""What the agent tells operators besides its log lines: structured events
(events.py), the metrics file (metrics_file.py)."""
