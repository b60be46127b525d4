"""rtrain: a fault-tolerant launcher for distributed PyTorch training."""

__version__ = "0.1.0"
