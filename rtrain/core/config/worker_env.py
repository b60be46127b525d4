"""What each worker is told: torchrun's environment, rtrain's own variables, and where
its output goes. Pure functions over a LaunchSpec and this generation's assignment."""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..contract.environment import DATA_WORLD, RTRAIN_GENERATION
from ..contract.pace import STRAGGLERS
from .launch_spec import LaunchSpec

STDOUT, STDERR = 1, 2

# torch's flight recorder: ProcessGroupNCCL keeps each rank's last collectives in a ring
# and, on its watchdog's timeout or a collective error, dumps them to <prefix><rank>.
# rtrain turns it on for workers on GPU nodes, the dumps in the worker's log folder,
# unless the user sized the ring (0: off). Both spellings: torch >= 2.7's TORCH_FR_* and
# the older TORCH_NCCL_* ones.
FLIGHT_RECORDER_ENTRIES = "2000"
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"
FLIGHT_RECORDER_SIZES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_FILES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FLIGHT_RECORDER_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"


@dataclass(frozen=True)
class NodeAssignment:
    """This node's place in one generation, as agreed at rendezvous."""

    generation: int
    node_rank: int
    num_nodes: int
    local_world_size: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int

    def global_rank(self, local_rank: int) -> int:
        return self.rank_offset + local_rank


@dataclass(frozen=True)
class StreamPlan:
    """redirect: streams written to files; tee: of those, streams also echoed to the console."""

    redirect: int
    tee: int


def stream_plan(spec: LaunchSpec, local_rank: int) -> StreamPlan:
    tee = spec.tee.mask(local_rank)
    redirect = spec.redirects.mask(local_rank) | tee
    if spec.local_ranks_filter is not None and local_rank not in spec.local_ranks_filter:
        # torchrun keeps filtered-out ranks off the console but still logs them to files.
        return StreamPlan(redirect=STDOUT | STDERR, tee=0)
    return StreamPlan(redirect=redirect, tee=tee)


def attempt_dir(run_log_dir: str, generation: int, local_rank: int) -> str:
    """torchrun's layout: <log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/."""
    return posixpath.join(run_log_dir, f"attempt_{generation}", str(local_rank))


def tee_prefix(role: str, global_rank: int) -> str:
    return f"[{role}{global_rank}]:"


def omp_threads_default(base_env: Mapping[str, str], local_world_size: int) -> str | None:
    """torchrun sets OMP_NUM_THREADS=1 when unset and several workers share the node."""
    if "OMP_NUM_THREADS" in base_env or local_world_size <= 1:
        return None
    return "1"


# Variables read once, when the interpreter starts or torch (with its OpenMP/MKL
# runtimes, glibc's malloc, the dynamic loader) is imported: a worker forked from the
# pool, which imported torch already, runs with the pool's values, whatever its own
# environment says. The pool is started with the workers' values (pool_environment);
# a worker whose value still differs is started as a fresh interpreter instead.
IMPORT_TIME_PREFIXES = (
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MALLOC_",
    "LD_",
    "PYTHON",
    "TORCHDYNAMO_",
    "TORCHINDUCTOR_",
)
IMPORT_TIME_NAMES = frozenset({"GLIBC_TUNABLES", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL"})


def is_import_time(name: str) -> bool:
    return name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)


def import_time_names_set(source: str) -> list[str]:
    """The import-time variables a script's source sets for itself (os.environ[N] = v,
    os.environ.setdefault(N, v), os.environ.update({N: v}), os.putenv(N, v) with N a
    literal), sorted: a script that sets OMP_NUM_THREADS before importing torch gets
    that under torchrun, and a worker forked from the pool, whose torch is imported
    already, would not. A source that does not parse sets nothing known."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        names.update(_names_set_by(node))
    return sorted(n for n in names if is_import_time(n))


def _names_set_by(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [
            t.slice.value
            for t in node.targets
            if isinstance(t, ast.Subscript)
            and isinstance(t.slice, ast.Constant)
            and isinstance(t.slice.value, str)
        ]
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return []
    if node.func.attr in ("setdefault", "putenv") and node.args:
        first = node.args[0]
        return (
            [first.value]
            if isinstance(first, ast.Constant) and isinstance(first.value, str)
            else []
        )
    if node.func.attr == "update" and node.args and isinstance(node.args[0], ast.Dict):
        keys = node.args[0].keys
        return [k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def pool_environment(base_env: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """The worker pool's environment: the node's, plus what rtrain sets for every worker
    and torch reads at import (OMP_NUM_THREADS=1 for several workers, as torchrun)."""
    env = dict(base_env)
    omp = omp_threads_default(base_env, local_world_size)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return env


def import_time_differences(
    pool_env: Mapping[str, str], worker_env: Mapping[str, str]
) -> list[str]:
    """Import-time variables whose worker value the pool's torch does not have, sorted."""
    names = {n for n in (*pool_env, *worker_env) if is_import_time(n)}
    return sorted(n for n in names if pool_env.get(n) != worker_env.get(n))


def flight_recorder_env(base_env: Mapping[str, str], log_dir: str) -> dict[str, str]:
    """The flight recorder's variables for a worker whose log folder is log_dir: none if
    the user set the ring's size (their choice, 0 turning it off), and none the user set."""
    if any(name in base_env for name in FLIGHT_RECORDER_SIZES):
        return {}
    prefix = posixpath.join(log_dir, FLIGHT_RECORDER_PREFIX)
    wanted = {
        **dict.fromkeys(FLIGHT_RECORDER_SIZES, FLIGHT_RECORDER_ENTRIES),
        **dict.fromkeys(FLIGHT_RECORDER_FILES, prefix),
        FLIGHT_RECORDER_DUMP_ON_TIMEOUT: "1",
    }
    return {name: value for name, value in wanted.items() if name not in base_env}


def flight_recorder_note(dumps: list[str]) -> str:
    """What a failure's message gains for the flight recorder's dumps found beside it."""
    return f"(flight recorder: {', '.join(dumps)})" if dumps else ""


def flight_recorder_named(message: str) -> list[str]:
    """The dumps a failure's message names (flight_recorder_note), or none."""
    found = re.search(r"\(flight recorder: ([^()]*)\)$", message)
    return found.group(1).split(", ") if found else []


def worker_environment(
    spec: LaunchSpec,
    assignment: NodeAssignment,
    local_rank: int,
    error_file: str,
    base_env: Mapping[str, str],
    flight_recorder: bool = False,
) -> dict[str, str]:
    """flight_recorder: the node has GPUs (NCCL): torch's flight recorder on, its dumps
    beside the worker's error file (flight_recorder_env)."""
    env = dict(base_env)
    rank = assignment.global_rank(local_rank)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": "0" if spec.virtual_local_rank else str(local_rank),
            "GROUP_RANK": str(assignment.node_rank),
            "ROLE_RANK": str(rank),
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(assignment.local_world_size),
            "WORLD_SIZE": str(assignment.world_size),
            "GROUP_WORLD_SIZE": str(assignment.num_nodes),
            "ROLE_WORLD_SIZE": str(assignment.world_size),
            "MASTER_ADDR": assignment.master_addr,
            "MASTER_PORT": str(assignment.master_port),
            # Every generation is a restart of the whole group, on every node alike.
            "TORCHELASTIC_RESTART_COUNT": str(assignment.generation),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_RUN_ID": spec.rdzv.run_id,
            # Workers are clients of a store the agent hosts (fresh every generation).
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(spec.signal_names),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            RTRAIN_GENERATION: str(assignment.generation),
        }
    )
    if spec.layout.tp == spec.layout.pp == 1:  # a data-parallel job's shares
        env[DATA_WORLD] = str(spec.nodes.max_nodes * assignment.local_world_size)
    env[STRAGGLERS] = spec.faults.stragglers  # what the workers measure and follow
    omp = omp_threads_default(base_env, assignment.local_world_size)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    if flight_recorder:
        env.update(flight_recorder_env(base_env, posixpath.dirname(error_file)))
    if spec.virtual_local_rank:
        visible = base_env.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
        if local_rank < len(devices):
            env["CUDA_VISIBLE_DEVICES"] = devices[local_rank]
    return env
