"""The rendezvous rules: store keys and wire records (protocol.py), failure records,
liveness on the observer's clock, restart accounting, and the agent's decisions as a
pure function of what happened (decisions.py). Pure."""
