"""A node's start-up for `rtrain launch`: Slurm, the spec and its preflight, then the agent."""
