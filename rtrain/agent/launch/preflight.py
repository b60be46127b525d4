"""Checks that need the file system or devices, run before anything starts."""

from __future__ import annotations

import os
import shutil

from ...core.config.launch_spec import EntryPoint, LaunchSpec, resolve_nproc
from ...core.errors import UsageError


def check_entrypoint(entry: EntryPoint) -> None:
    if entry.kind == "script":
        if not os.path.exists(entry.target):
            raise UsageError(f"training script not found: {entry.target}")
        if os.path.isdir(entry.target) and not os.path.exists(
            os.path.join(entry.target, "__main__.py")
        ):
            raise UsageError(f"training script is a folder without __main__.py: {entry.target}")
    elif entry.kind == "exec":
        if os.sep in entry.target:
            path = entry.target
            if not os.path.isfile(path):
                raise UsageError(f"--no-python: program not found: {path}")
        else:
            found = shutil.which(entry.target)
            if found is None:
                raise UsageError(f"--no-python: {entry.target} is not an executable on PATH")
            path = found
        if not os.access(path, os.X_OK):
            raise UsageError(
                f"--no-python: {path} is not executable (chmod +x it, or drop --no-python)"
            )


def gpu_count() -> int:
    """GPUs visible to this process, without initialising CUDA in the agent."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPUs
        return 0


def local_world_size(spec: LaunchSpec) -> int:
    if spec.nproc_per_node.isdigit():
        return int(spec.nproc_per_node)
    return resolve_nproc(spec.nproc_per_node, gpu_count(), os.cpu_count() or 1)


def preflight(spec: LaunchSpec) -> int:
    """Validate what the spec points at; return this node's number of workers."""
    check_entrypoint(spec.entrypoint)
    if spec.log_dir:
        check_log_dir(spec.log_dir)
    return local_world_size(spec)


def check_log_dir(path: str) -> None:
    """--log-dir must be a folder this user can write (made if it is missing)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-dir {path}: {exc.strerror}") from None
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--log-dir {path}: not a folder this user can write")
