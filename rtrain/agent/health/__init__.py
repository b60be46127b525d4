"""The agent's GPU health: NVML readings (real or a scenario-driven fake), the
background monitor and XID events, what to do about a fault, and draining the node in
Slurm. The verdicts themselves are pure: core/health."""
