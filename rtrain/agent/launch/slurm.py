"""What rtrain asks Slurm itself (scontrol), beyond its environment variables."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess

logger = logging.getLogger(__name__)


def resolve_node_address(node: str, timeout: float = 10.0) -> str:
    """The address a Slurm node answers on: its name when that resolves, else the
    NodeAddr Slurm has for it (clusters whose node names are not in DNS), else the name."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except OSError:
        pass
    if shutil.which("scontrol") is None:
        return node
    try:
        done = subprocess.run(
            ["scontrol", "show", "node", "-o", node],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("scontrol show node %s failed: %s", node, exc)
        return node
    for field in done.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node
