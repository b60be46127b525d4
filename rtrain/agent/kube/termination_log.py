"""The container's termination message: the one-line reason of a non-zero exit.

Kubernetes shows the file at a container's terminationMessagePath (default
/dev/termination-log, a file the kubelet mounts) in the pod's status, where a Job's
podFailurePolicy, a JobSet's failurePolicy and `kubectl describe` read it beside the
exit code. rtrain writes it only where the file is already there and writable (the
kubelet made it), never creates one in a machine's /dev; RTRAIN_TERMINATION_LOG names
another path (created if need be), for tests and for a pod whose terminationMessagePath
is elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ...core.errors import ExitCode

logger = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/termination-log"
PATH_VARIABLE = "RTRAIN_TERMINATION_LOG"
LIMIT_BYTES = 4096  # the kubelet keeps this much of the file


def message_for(code: int, reason: str) -> str:
    """`exit 75 (TEMPFAIL): <reason>`, one line within the kubelet's limit."""
    try:
        name = f" ({ExitCode(code).name})"
    except ValueError:
        name = f" (signal {code - 128})" if code > 128 else ""
    text = " ".join(reason.split()) or "no reason given"
    line = f"rtrain: exit {code}{name}: {text}"
    data = line.encode("utf-8", "replace")
    if len(data) > LIMIT_BYTES - 1:
        line = data[: LIMIT_BYTES - 4].decode("utf-8", "ignore") + "..."
    return line + "\n"


def write_termination_log(code: int, reason: str, environ: Mapping[str, str]) -> str | None:
    """Write the reason of a non-zero exit to the termination message file; the path
    written, or None (exit 0, no such file here, or not writable)."""
    if code == ExitCode.SUCCESS:
        return None
    override = environ.get(PATH_VARIABLE, "").strip()
    path = override or DEFAULT_PATH
    if not override and not (os.path.isfile(path) and os.access(path, os.W_OK)):
        return None
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(message_for(code, reason))
    except OSError as exc:
        logger.warning("cannot write the termination message to %s: %s", path, exc)
        return None
    return path
