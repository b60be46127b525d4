"""The DP x PP x TP grid of a generation and how it is recomputed after failures
(topology.py), and the ReCycle plan a grid carries to its workers (recycle.py). Pure."""
