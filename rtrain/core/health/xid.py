"""What an XID (an NVIDIA driver error event) means for a training job.

The catalogue is NVIDIA's for Ampere and newer (REFERENCE.md section 4), reduced to the
one decision an agent makes: keep the node and restart its workers, or take the node
out of the job until its GPU is reset or the machine rebooted.
"""

from __future__ import annotations

from enum import Enum


class Action(str, Enum):
    """What a finding asks for, from nothing to taking the node out of the job."""

    NONE = "none"
    RESTART_WORKERS = "restart workers"  # application-level: the node stays
    RESET_GPU = "reset GPU"  # the node leaves the job (and is drained under Slurm)
    REBOOT_NODE = "reboot node"
    SERVICE_GPU = "service GPU"  # the hardware itself needs replacing

    @property
    def excludes_node(self) -> bool:
        return self in (Action.RESET_GPU, Action.REBOOT_NODE, Action.SERVICE_GPU)

    @property
    def rank(self) -> int:
        return list(Action).index(self)


APPLICATION_XIDS = frozenset({13, 31, 43, 45, 63, 94})
RESET_XIDS = frozenset({46, 62, 64, 95, 109, 119, 120, 136, 140, 143})
ECC_XIDS = frozenset({48})
NVLINK_XIDS = frozenset({74, *range(144, 151)})
BUS_XIDS = frozenset({79})

XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "GPU reset required",
    140: "ECC unrecovered error",
    143: "GPU initialization failure",
}


def classify_xid(xid: int) -> Action:
    """The action an XID calls for. One rtrain does not know restarts the workers (and
    is reported as such): taking a node out for an unknown code would be worse."""
    if xid in BUS_XIDS:
        return Action.REBOOT_NODE
    if xid in RESET_XIDS or xid in ECC_XIDS or xid in NVLINK_XIDS:
        return Action.RESET_GPU
    return Action.RESTART_WORKERS


def describe_xid(xid: int) -> str:
    if xid in XID_NAMES:
        return f"XID {xid} ({XID_NAMES[xid]})"
    if xid in NVLINK_XIDS:
        return f"XID {xid} (NVLink error)"
    return f"XID {xid} (not in rtrain's catalogue)"
