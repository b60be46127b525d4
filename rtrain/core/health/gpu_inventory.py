"""Which GPUs a node should have, and which of them this job uses.

Both come from what Slurm and CUDA say: SLURM_GPUS_ON_NODE, SLURM_STEP_GPUS /
SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES (indices, or UUIDs and their prefixes, as CUDA
accepts them). A job that holds two GPUs of an eight-GPU node must not be taken out
because a GPU of another job is sick.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import UsageError
from .gpu_health import GpuSample

NO_DEVICES = ("", "NoDevFiles")


def expected_gpus(environ: Mapping[str, str]) -> int | None:
    """The GPU count this node should have, from what Slurm or CUDA_VISIBLE_DEVICES says;
    None when nothing says (then the count is not checked)."""
    on_node = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node:
        try:
            return int(on_node)
        except ValueError:
            raise UsageError(f"SLURM_GPUS_ON_NODE={on_node!r} is not a number") from None
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(name)
        if value is not None and value.strip() not in NO_DEVICES:
            return len([v for v in value.split(",") if v.strip()])
    return None


def watched_gpus(samples: list[GpuSample], environ: Mapping[str, str]) -> list[GpuSample]:
    """The GPUs of `samples` that CUDA_VISIBLE_DEVICES names (all when it is unset).

    Entries are NVML indices or UUID prefixes. When none of them matches (a cgroup that
    renumbers devices, say), every GPU is watched: better a false alarm than none.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() in NO_DEVICES:
        return samples
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    chosen = [
        s
        for s in samples
        if any(
            e == str(s.index) or (e.startswith("GPU-") and s.uuid.startswith(e)) for e in entries
        )
    ]
    return chosen or samples
