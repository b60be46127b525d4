"""This node's workers: the preloaded pool that forks them (pool.py, zygote.py,
boot.py), one generation's group and its supervision (group.py), heartbeat files and
hang stacks (hang_watch.py), the tee of their logs (log_tail.py), and the processes
they leave behind (process_tree.py)."""
