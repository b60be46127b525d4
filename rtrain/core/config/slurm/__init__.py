"""What rtrain reads from a Slurm job's environment (env.py) and Slurm's hostlist
expressions (hostlist.py)."""
