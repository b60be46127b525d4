"""Draining this node in Slurm, so that no job lands on a GPU that failed its checks.

`scontrol update nodename=<node> state=drain reason="..."`: Slurm requires a reason, and
ours names the failed check, so an operator reading `sinfo -R` knows what to look at.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Mapping

from ...core.errors import UsageError

logger = logging.getLogger(__name__)

REASON_LIMIT = 200  # Slurm keeps the reason in its state file: keep it one short line


class DrainError(Exception):
    """scontrol refused or failed: the reason, in one line."""


def slurm_node_name(environ: Mapping[str, str]) -> str:
    """This node's name in Slurm; a UsageError when rtrain does not run under Slurm."""
    name = environ.get("SLURMD_NODENAME", "").strip()
    if not name:
        raise UsageError("--drain needs Slurm: SLURMD_NODENAME is not set on this node")
    if shutil.which("scontrol") is None:
        raise UsageError("--drain needs Slurm's scontrol on PATH")
    return name


def drain_node(node: str, reason: str, timeout: float = 30.0) -> None:
    reason = " ".join(reason.split())[:REASON_LIMIT]
    command = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DrainError(f"scontrol did not run: {exc}") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise DrainError(
            f"scontrol refused to drain {node}: {message[-1] if message else done.returncode}"
        )
    logger.warning("drained Slurm node %s: %s", node, reason)
