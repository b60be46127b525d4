"""What a job tells its operators: structured events (events.py), the metrics folded from
them (metrics.py) and the report made of a run's events (report.py). Pure."""
