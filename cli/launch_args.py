"""torchrun's command line, flag for flag: every dashed flag also takes its underscore
spelling and a PET_<DEST> default from the environment, exactly like torchrun.

argparse is used (not typer) because torchrun's grammar needs it: options end at the
script, and everything after the script belongs to the script.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..core.errors import UsageError

NOT_ACTED_ON = "[accepted for compatibility, not acted on]"
# Flags rtrain accepts but does not act on, with the value that changes nothing.
IGNORED_DEFAULTS: dict[str, object] = {
    "start_method": "spawn",
    "event_log_handler": "null",
    "logs_specs": None,
    "numa_binding": None,
    "duplicate_stdout_filters": "",
    "duplicate_stderr_filters": "",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"rtrain launch: {message}")


def _env_default(environ: Mapping[str, str], dest: str, default: Any) -> Any:
    return environ.get(f"PET_{dest.upper()}", default)


def _env_switch(environ: Mapping[str, str], dest: str) -> bool:
    value = environ.get(f"PET_{dest.upper()}")
    return value is not None and value.strip() not in ("", "0")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rtrain launch",
        description=(
            "Launch distributed training: a drop-in replacement for torchrun that survives "
            "crashed and hung ranks, sick GPUs and lost nodes. Every flag can also be set "
            "as PET_<FLAG> in the environment (e.g. PET_NNODES=2)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Training scripts may call rtrain.core.heartbeat(step) (hang detection) and "
            "rtrain.core.topology() (their dp/pp/tp ranks); RTRAIN_GENERATION is the job's "
            "generation, +1 at every restart. Exit codes: 0 success; 1 the job failed and "
            "rtrain gave up; 64 bad command line; 75 temporary failure (requeue may help); "
            "76 the nodes left cannot hold the --tp/--pp layout; 77 this node left the job for a "
            "GPU fault; 128+N stopped by signal N. Under Slurm (srun --ntasks-per-node=1) the "
            "node count, rank, rendezvous and run id come from SLURM_* unless given."
        ),
    )

    def value(*flags: str, default: Any, help: str, **kwargs: Any) -> None:
        dest = kwargs.pop("dest", None) or max(flags, key=len).lstrip("-").replace("-", "_")
        parser.add_argument(
            *flags, dest=dest, default=_env_default(environ, dest, default), help=help, **kwargs
        )

    def switch(*flags: str, help: str) -> None:
        dest = max(flags, key=len).lstrip("-").replace("-", "_")
        parser.add_argument(
            *flags, dest=dest, action="store_true", default=_env_switch(environ, dest), help=help
        )

    def both(name: str) -> tuple[str, ...]:
        dashed = f"--{name}"
        under = f"--{name.replace('-', '_')}"
        return (dashed, under) if under != dashed else (dashed,)

    value("--nnodes", default="1:1", help="Number of nodes, N or MIN:MAX (elastic).")
    value(
        *both("nproc-per-node"), default="1", help="Workers per node: an integer, auto, cpu or gpu."
    )
    value(*both("rdzv-backend"), default="static", help="Rendezvous backend: static or c10d.")
    value(
        *both("rdzv-endpoint"), default="", help="Rendezvous store HOST[:PORT] (c10d port 29400)."
    )
    value(*both("rdzv-id"), default="none", help="Job id shared by all nodes.")
    value(
        *both("rdzv-conf"),
        default="",
        help="k=v,... join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
        "read_timeout (seconds), is_host.",
    )
    switch("--standalone", help="Single node: a local store on a free port, a random job id.")
    value(
        *both("max-restarts"),
        default=0,
        help="Restarts of the worker group allowed after a failure.",
    )
    value(*both("monitor-interval"), default=0.1, help="Seconds between checks of the workers.")
    value(
        *both("start-method"),
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help=f"{NOT_ACTED_ON} rtrain always forks workers from its torch-preloaded pool.",
    )
    value(*both("event-log-handler"), default="null", help=f"{NOT_ACTED_ON}")
    value("--role", default="default", help="Role name of the workers (ROLE_NAME).")
    switch("-m", "--module", help="Run the entry point as a module, like python -m.")
    switch(*both("no-python"), help="Execute the entry point directly, without python.")
    switch(*both("run-path"), help="Run the script with runpy.run_path (what rtrain always does).")
    value(
        *both("log-dir"),
        default=None,
        help="Base folder for workers' logs (default: a temp folder).",
    )
    value("-r", "--redirects", default="0", help="Streams to files: 0-3 (1 out, 2 err) or 0:1,1:2.")
    value(
        "-t", "--tee", default="0", help="Streams to files and console with a [roleRANK]: prefix."
    )
    value(
        *both("local-ranks-filter"), default="", help="Console output only from these local ranks."
    )
    value(*both("duplicate-stdout-filters"), default="", help=f"{NOT_ACTED_ON}")
    value(*both("duplicate-stderr-filters"), default="", help=f"{NOT_ACTED_ON}")
    value(*both("node-rank"), default=0, help="This node's rank (static backend).")
    value(*both("master-addr"), default="127.0.0.1", help="Static backend: node 0's address.")
    value(*both("master-port"), default=None, help="Static backend: the rendezvous port on node 0.")
    value(
        *both("local-addr"),
        default=None,
        help="This node's address as peers reach it (default FQDN).",
    )
    value(*both("logs-specs"), default=None, help=f"{NOT_ACTED_ON}")
    value(*both("numa-binding"), default=None, help=f"{NOT_ACTED_ON}")
    value(
        *both("signals-to-handle"),
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help="Signals rtrain forwards to the workers before exiting.",
    )
    value(
        *both("shutdown-timeout"),
        default=None,
        help="Seconds between forwarding a signal and SIGKILL (default 30).",
    )
    switch(*both("virtual-local-rank"), help="LOCAL_RANK=0 and one GPU visible per worker.")
    # rtrain's own flags.
    value(
        "--preload",
        default="torch",
        help="Modules the worker pool imports once so restarts skip them (comma list, or none).",
    )
    switch(*both("dry-run"), help="Print what rtrain resolved and exit without starting anything.")
    value("--tp", default=1, help="Tensor-parallel size; each TP group stays on one node.")
    value("--pp", default=1, help="Pipeline stages; DP is the world size / (PP x TP).")
    value(
        *both("heartbeat-interval"),
        default=1.0,
        help="Seconds between an agent's lease renewals (default 1).",
    )
    value(
        *both("heartbeat-timeout"),
        default=None,
        help="Seconds without a renewal before a node counts as lost "
        "(default 5, or --rdzv-conf heartbeat_timeout).",
    )
    value(
        *both("hang-timeout"),
        default=60.0,
        help="Seconds a worker may go without rtrain.core.heartbeat() after its first call "
        "before it counts as hung (default 60).",
    )
    value(
        *both("snapshot-memory"),
        default=None,
        help="Shared memory for in-memory snapshots on this node, e.g. 8G "
        "(default: half of /dev/shm).",
    )
    value(
        *both("snapshot-copies"),
        default=2,
        help="Copies of each snapshot shard on distinct nodes, the original included (default 2).",
    )
    value(
        *both("checkpoint-dir"),
        default=None,
        help="Disk checkpoints (shared by all nodes): restored from only when no copy of "
        "some shard survives in memory.",
    )
    value(
        *both("checkpoint-every"),
        default=0,
        help="Write a disk checkpoint every N steps, in the background, from the snapshot "
        "already in memory (default 0: never).",
    )
    value(
        *both("secret-file"),
        default=None,
        help="A file only you can read (mode 0600) holding the job secret that authenticates "
        "the agents' shard servers; RTRAIN_SECRET takes precedence. Without either, a "
        "random secret goes through the rendezvous store (see README, Security).",
    )
    value(
        *both("restart-backoff"),
        default=1.0,
        help="Seconds a node whose workers fail again within a minute of starting waits "
        "before the next restart, doubling up to 30 (default 1; the first restart is "
        "immediate; 0: never wait).",
    )
    switch(
        *both("kill-process-tree"),
        help="When workers stop, also stop every process they started, even detached "
        "ones (the agent becomes their subreaper); torchrun leaves them running.",
    )
    value(
        *both("max-node-failures"),
        default=0,
        help="Exclude a node from the job after this many failures charged to it (0: never).",
    )
    value(
        *both("health-interval"),
        default=10.0,
        help="Check this node's GPUs through NVML every N seconds (XID events at once); "
        "0: off. Nodes without an NVIDIA driver skip the checks.",
    )
    switch(
        *both("drain-on-fault"),
        help="Under Slurm, drain a node whose GPU fault takes it out of the job, with the "
        "failed check as the reason.",
    )
    value(
        *both("recycle-profile"),
        default=None,
        help="A JSON job profile (per-stage forward, backward_input, backward_weight, "
        "optimizer times, microbatches): after each loss, plan how the survivors absorb it "
        "(ReCycle) and hand each worker its action list (rtrain.core.recycle_actions()).",
    )
    parser.add_argument("training_script", nargs="?", help="The script (or module, with -m).")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def parse_launch_args(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """Raw flag values keyed by torchrun's dests, plus `ignored_flags` the user set and
    `explicit`: the dests given on the command line or as PET_* (Slurm fills the rest)."""
    parser = build_parser(environ)
    namespace = parser.parse_args(list(argv))
    raw = vars(namespace)
    unset = object()
    parser.set_defaults(**{dest: unset for dest in raw})
    given = vars(parser.parse_args(list(argv)))
    raw["explicit"] = {d for d, v in given.items() if v is not unset} | {
        d for d in raw if f"PET_{d.upper()}" in environ
    }
    raw["ignored_flags"] = tuple(
        f"--{dest.replace('_', '-')}"
        for dest, neutral in IGNORED_DEFAULTS.items()
        if raw.get(dest) != neutral
    )
    return raw


def launch_help(environ: Mapping[str, str]) -> str:
    return build_parser(environ).format_help()
