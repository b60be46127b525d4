"""What a launch asks for: torchrun's flags and their values (launch_spec.py,
flag_values.py), Slurm's environment and hostlists, and what each worker is told
(worker_env.py). Pure."""
