"""Repair in place, the agent's side: survivors parked and handed the next generation
(coordinator.py), over each worker's control folder (control.py)."""
