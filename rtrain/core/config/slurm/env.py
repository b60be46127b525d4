"""What Slurm tells `rtrain launch`, and the torchrun flags it stands for.

Under `srun --ntasks-per-node=1 rtrain launch ...` the node count, this node's rank,
the rendezvous endpoint (the first node of the step, on a port derived from the job
id) and the run id (the job id) come from SLURM_*; `--nproc-per-node` defaults to the
GPUs Slurm gave this node. A flag given on the command line (or as PET_*) always wins.
Every variable is checked against the others: a contradiction is a UsageError naming
the variables, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ..flag_values import MAX_COUNT, ascii_int
from .hostlist import HostlistError, expand_hostlist

_TASKS = re.compile(r"[0-9]{1,9}(\(x[0-9]{1,9}\))?")

PORT_BASE = 20000  # rendezvous port = PORT_BASE + job id % PORT_SPAN
PORT_SPAN = 10000
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
NNODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
RDZV_FLAGS = ("rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr", "master_port")


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    nodes: tuple[str, ...]  # the step's nodes, in Slurm's order
    node_id: int  # this node's index in `nodes` (SLURM_NODEID)
    gpus_on_node: int | None
    restart_count: int  # SLURM_RESTART_COUNT: how often this job was requeued

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def port(self) -> int:
        return PORT_BASE + self.job_id % PORT_SPAN


def read_slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job this process runs in, or None outside Slurm (or RTRAIN_NO_SLURM=1)."""
    if "SLURM_JOB_ID" not in environ or environ.get("RTRAIN_NO_SLURM") == "1":
        return None
    job_id = _number(environ, "SLURM_JOB_ID", "a job id")
    name, text = next(((v, environ[v]) for v in NODELIST_VARS if environ.get(v)), ("", ""))
    if not name:
        raise UsageError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is missing or empty")
    try:
        nodes = tuple(expand_hostlist(text))
    except HostlistError as exc:
        raise UsageError(f"{name}={text!r}: {exc}") from None
    for count_name in NNODES_VARS:
        if count_name in environ:
            count = _number(environ, count_name, "a node count")
            if count != len(nodes):
                raise UsageError(
                    f"{count_name}={count} but {name}={text!r} names {len(nodes)} nodes"
                )
            break
    node_id = _number(environ, "SLURM_NODEID", "a node index") if "SLURM_NODEID" in environ else 0
    if node_id >= len(nodes):
        raise UsageError(f"SLURM_NODEID={node_id} but {name}={text!r} names {len(nodes)} nodes")
    me = environ.get("SLURMD_NODENAME", "").strip()
    if me and me != nodes[node_id]:
        raise UsageError(
            f"SLURMD_NODENAME={me} but SLURM_NODEID={node_id} is {nodes[node_id]} in {name}"
        )
    _one_task_per_node(environ)
    gpus = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    return SlurmJob(
        job_id=job_id,
        nodes=nodes,
        node_id=node_id,
        gpus_on_node=_number(environ, "SLURM_GPUS_ON_NODE", "a GPU count") if gpus else None,
        restart_count=_number(environ, "SLURM_RESTART_COUNT", "a count")
        if environ.get("SLURM_RESTART_COUNT", "").strip()
        else 0,
    )


def _number(environ: Mapping[str, str], name: str, what: str) -> int:
    value = ascii_int(environ.get(name, ""))
    if value is None or value >= MAX_COUNT:
        raise UsageError(f"{name}={environ.get(name, '')!r} is not {what} (a number)")
    return value


def _one_task_per_node(environ: Mapping[str, str]) -> None:
    """rtrain is one agent per node: srun --ntasks-per-node=1 (its workers are its own)."""
    if environ.get("SLURM_NTASKS_PER_NODE", "").strip():
        per_node = _number(environ, "SLURM_NTASKS_PER_NODE", "a task count")
        if per_node != 1:
            raise UsageError(
                f"SLURM_NTASKS_PER_NODE={per_node}: rtrain launch runs one task per node "
                "(srun --ntasks-per-node=1); it starts the workers itself"
            )
    layout = environ.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    if not layout:
        return
    for part in layout.split(","):
        if not _TASKS.fullmatch(part.strip()):
            raise UsageError(
                f"SLURM_STEP_TASKS_PER_NODE={layout!r} is not a Slurm task layout (such as 1(x4),2)"
            )
        tasks = part.strip().split("(", 1)[0]
        if tasks != "1":
            raise UsageError(
                f"SLURM_STEP_TASKS_PER_NODE={layout}: rtrain launch runs one task per node "
                "(srun --ntasks-per-node=1); it starts the workers itself"
            )


def apply_slurm(
    raw: dict[str, Any],
    explicit: set[str],
    job: SlurmJob,
    addresses: Mapping[str, str],
) -> tuple[dict[str, Any], list[str]]:
    """raw launch flags with Slurm's values where no flag was given; and what was taken,
    for the first log line. addresses: node name -> the address it answers on (for the
    first node and this one)."""
    raw = dict(raw)
    took: list[str] = []
    head_addr = addresses.get(job.head, job.head)
    me = job.nodes[job.node_id]
    if "local_addr" not in explicit and not raw.get("standalone"):
        raw["local_addr"] = addresses.get(me, me)
        took.append(f"this node's address {raw['local_addr']}")
    if raw.get("standalone") or any(flag in explicit for flag in RDZV_FLAGS):
        took.append("rendezvous from the flags")
    else:
        raw["rdzv_backend"] = "c10d"
        raw["rdzv_endpoint"] = f"{head_addr}:{job.port}"
        raw["rdzv_id"] = str(job.job_id)
        conf = str(raw.get("rdzv_conf") or "")
        if "is_host" not in conf:  # the first node hosts the store
            host = f"is_host={'true' if job.node_id == 0 else 'false'}"
            raw["rdzv_conf"] = f"{conf},{host}" if conf else host
        took.append(f"rendezvous {job.head} ({head_addr}):{job.port}, run id {job.job_id}")
    if "nnodes" not in explicit and not raw.get("standalone"):
        # Elastic down to one node, so that with `srun --no-kill` the survivors go on.
        raw["nnodes"] = f"1:{len(job.nodes)}" if len(job.nodes) > 1 else "1"
        took.append(f"{len(job.nodes)} nodes ({','.join(job.nodes)})")
    if "node_rank" not in explicit:
        raw["node_rank"] = job.node_id
        took.append(f"this node rank {job.node_id}")
    if "nproc_per_node" not in explicit and job.gpus_on_node:
        raw["nproc_per_node"] = str(job.gpus_on_node)
        took.append(f"{job.gpus_on_node} processes per node (SLURM_GPUS_ON_NODE)")
    if job.restart_count:
        took.append(f"requeued {job.restart_count} time(s)")
    return raw, took
