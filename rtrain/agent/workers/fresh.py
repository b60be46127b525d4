"""A worker started as a fresh interpreter, not forked from the pool (--start-method
spawn, import-time settings that differ from the pool's, or a pool's warm-up starved on
a loaded node): `python -u -m rtrain.agent.workers.fresh KIND TARGET ARGS...` runs the
entry point the way a forked worker does (boot.run_fresh_interpreter). Run straight as
`python -u script.py`, its uncaught exception or sys.exit(3) left no error file, and a
culprit the agent stopped mid-shutdown was not charged (a loaded run of
test_a_flapping_node_is_excluded)."""

import sys

from .boot import run_fresh_interpreter

if __name__ == "__main__":
    run_fresh_interpreter(sys.argv[1:])
