"""Every flag of `rtrain launch`, once: name, value, default, help, environment.

This table is the single source of the argparse parser (cli/launch_args.py), of the
defaults build_launch_spec fills in (launch_spec.py) and the spec dataclasses carry,
and of the flag tables in README.md and docs/flags.md (scripts/settings_doc.py writes
them; tests/unit/core/test_settings.py fails when they drift). Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOT_ACTED_ON = "[accepted for compatibility, not acted on]"


@dataclass(frozen=True)
class Setting:
    """One flag. Every flag is also read from PET_<DEST> (torchrun's convention)."""

    name: str  # the dashed long name without "--": "nproc-per-node"
    default: Any  # the raw value argparse hands on when the flag is absent
    help: str
    value: str = ""  # the metavar in docs ("N", "S", "FILE"); "" for a switch
    switch: bool = False  # takes no value (store_true)
    short: str | None = None  # "-m", "-r", "-t"
    underscore: bool = True  # also --nproc_per_node, as torchrun
    choices: tuple[str, ...] | None = None
    own: bool = False  # rtrain's own, not torchrun's
    acted_on: bool = True  # False: torchrun's, accepted and ignored (the default changes nothing)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return f"PET_{self.dest.upper()}"

    @property
    def flags(self) -> tuple[str, ...]:
        dashed = f"--{self.name}"
        under = f"--{self.dest}"
        spellings = (dashed, under) if self.underscore and under != dashed else (dashed,)
        return (self.short, *spellings) if self.short else spellings

    @property
    def full_help(self) -> str:
        return self.help if self.acted_on else f"{NOT_ACTED_ON} {self.help}".rstrip()


S = Setting
SETTINGS: tuple[Setting, ...] = (
    # -- torchrun's --
    S("nnodes", "1:1", "number of nodes, N or MIN:MAX (elastic)", "N", underscore=False),
    S("nproc-per-node", "1", "workers per node: an integer, auto, cpu or gpu", "N"),
    S(
        "rdzv-backend",
        "static",
        "rendezvous backend: static, c10d (a TCPStore on one node) or etcd / etcd-v2 "
        "(an etcd v3 cluster)",
        "NAME",
    ),
    S(
        "rdzv-endpoint",
        "",
        "rendezvous store HOST[:PORT] (c10d port 29400); etcd: HOST[:PORT],... "
        "(port 2379), every member",
        "HOST:PORT",
    ),
    S("rdzv-id", "none", "job id shared by all nodes", "ID"),
    S(
        "rdzv-conf",
        "",
        "k=v,... join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
        "read_timeout (seconds), is_host; etcd: protocol=https, cacert, cert, key "
        "(files), timeout (= join_timeout)",
        "K=V,...",
    ),
    S(
        "standalone",
        False,
        "single node: a local store on a free port, a random job id",
        switch=True,
        underscore=False,
    ),
    S("max-restarts", 0, "restarts of the worker group allowed after a failure", "N"),
    S("monitor-interval", 0.1, "seconds between checks of the workers", "S"),
    S(
        "start-method",
        None,
        "spawn: every worker a fresh interpreter, as torchrun starts it (import-time "
        "settings are the script's; a restart imports torch again); fork, forkserver or "
        "unset: workers forked from rtrain's preloaded pool",
        "METHOD",
        choices=("spawn", "fork", "forkserver"),
    ),
    S("event-log-handler", "null", "", "NAME", acted_on=False),
    S("role", "default", "role name of the workers (ROLE_NAME)", "NAME", underscore=False),
    S(
        "module",
        False,
        "run the entry point as a module, like python -m",
        switch=True,
        short="-m",
        underscore=False,
    ),
    S("no-python", False, "execute the entry point directly, without python", switch=True),
    S(
        "run-path",
        False,
        "run the script with runpy.run_path (what rtrain always does)",
        switch=True,
    ),
    S("log-dir", None, "base folder for workers' logs (default: a temp folder)", "DIR"),
    S(
        "redirects",
        "0",
        "streams to files: 0-3 (1 out, 2 err) or 0:1,1:2",
        "MAP",
        short="-r",
        underscore=False,
    ),
    S(
        "tee",
        "0",
        "streams to files and console with a [roleRANK]: prefix",
        "MAP",
        short="-t",
        underscore=False,
    ),
    S("local-ranks-filter", "", "console output only from these local ranks", "RANKS"),
    S("duplicate-stdout-filters", "", "", "FILTERS", acted_on=False),
    S("duplicate-stderr-filters", "", "", "FILTERS", acted_on=False),
    S("node-rank", 0, "this node's rank (static backend)", "N"),
    S("master-addr", "127.0.0.1", "static backend: node 0's address", "HOST"),
    S("master-port", None, "static backend: the rendezvous port on node 0", "PORT"),
    S("local-addr", None, "this node's address as peers reach it (default FQDN)", "HOST"),
    S("logs-specs", None, "", "NAME", acted_on=False),
    S("numa-binding", None, "", "NAME", acted_on=False),
    S(
        "signals-to-handle",
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "signals rtrain forwards to the workers before exiting",
        "SIGNALS",
    ),
    S(
        "shutdown-timeout",
        None,
        "seconds between forwarding a signal and SIGKILL (default 30)",
        "S",
    ),
    S(
        "virtual-local-rank",
        False,
        "LOCAL_RANK=0 and one GPU visible per worker",
        switch=True,
    ),
    # -- rtrain's own --
    S(
        "preload",
        "torch",
        "modules the worker pool imports once so restarts skip them (comma list; `none` "
        "to disable)",
        "MODULES",
        underscore=False,
        own=True,
    ),
    S(
        "dry-run",
        False,
        "print what rtrain resolved (nodes, rendezvous, fault settings, the DP x PP x TP "
        "grid) and exit",
        switch=True,
        own=True,
    ),
    S(
        "tp",
        1,
        "tensor-parallel size; each TP group stays on one node",
        "N",
        underscore=False,
        own=True,
    ),
    S(
        "pp",
        1,
        "pipeline stages; DP = world size / (PP x TP)",
        "N",
        underscore=False,
        own=True,
    ),
    S("heartbeat-interval", 1.0, "seconds between an agent's lease renewals", "S", own=True),
    S(
        "heartbeat-timeout",
        None,
        "seconds without a renewal before a node counts as lost (default 5, or "
        "`--rdzv-conf heartbeat_timeout=`)",
        "S",
        own=True,
    ),
    S(
        "hang-timeout",
        60.0,
        "seconds a worker may go without `rtrain.core.heartbeat()` after its first call "
        "before it counts as hung",
        "S",
        own=True,
    ),
    S(
        "snapshot-memory",
        None,
        "shared memory this node may use for snapshots and peers' replicas, e.g. `8G` "
        "(default: half of `/dev/shm`)",
        "SIZE",
        own=True,
    ),
    S(
        "snapshot-copies",
        2,
        "copies of each snapshot shard on distinct nodes, the original included",
        "N",
        own=True,
    ),
    S(
        "snapshot-dp-delta",
        "on",
        "send a replica to a node that runs the shard's DP twin as only the chunks that "
        "twin's shard of the same step lacks (`off`: always the whole shard)",
        "MODE",
        choices=("on", "off"),
        own=True,
    ),
    S(
        "checkpoint-dir",
        None,
        "disk checkpoints (shared by all nodes), read only when no copy of some shard "
        "survives in memory",
        "DIR",
        own=True,
    ),
    S(
        "checkpoint-every",
        0,
        "write a disk checkpoint every N steps, in the background, from the in-memory "
        "snapshot (0: never)",
        "N",
        own=True,
    ),
    S(
        "keep-checkpoints",
        3,
        "complete disk checkpoints kept in --checkpoint-dir: the step folders older than "
        "the newest K are deleted after each step written (0: keep all)",
        "K",
        own=True,
    ),
    S(
        "secret-file",
        None,
        "the job secret that authenticates the agents' shard servers, in a file only you "
        "can read (mode 0600); `RTRAIN_SECRET` takes precedence; without either a random "
        "secret goes through the rendezvous store (see Security)",
        "FILE",
        own=True,
    ),
    S(
        "restart-backoff",
        1.0,
        "a node whose workers fail again within a minute of starting waits S, then 2S, "
        "... (up to 30 s) before the next restart; the first restart is immediate (0: "
        "never wait)",
        "S",
        own=True,
    ),
    S(
        "kill-process-tree",
        False,
        "when workers stop, also stop every process they started, detached ones included "
        "(torchrun leaves them running)",
        switch=True,
        own=True,
    ),
    S(
        "max-node-failures",
        0,
        "exclude a node from the job once it was lost, or the root cause of a failure, N "
        "times (0: never)",
        "N",
        own=True,
    ),
    S(
        "health-interval",
        10.0,
        "run every GPU check every S seconds (XIDs are taken as they come; 0: off; nodes "
        "without an NVIDIA driver skip the checks)",
        "S",
        own=True,
    ),
    S(
        "drain-on-fault",
        False,
        "under Slurm, drain a node whose GPU fault takes it out of the job, with the "
        "failed check as the reason",
        switch=True,
        own=True,
    ),
    S(
        "recycle-profile",
        None,
        "a job profile (per-stage F/B/W/optimizer times, `microbatches`): every "
        "generation hands each worker its ReCycle action list "
        "(`rtrain.core.recycle_actions()`), the fault-free one until a loss",
        "FILE",
        own=True,
    ),
    S(
        "events",
        "on",
        "append structured events (generations, faults, restores, replication, GPU "
        "checks; JSON lines) to `events.jsonl` in the run's log folder (`off`: none)",
        "MODE",
        choices=("on", "off"),
        own=True,
    ),
    S(
        "metrics-file",
        None,
        "keep this node's metrics in FILE in Prometheus text format, for node_exporter's "
        "textfile collector (rewritten whole as they change)",
        "FILE",
        own=True,
    ),
    S(
        "metrics-port",
        None,
        "serve this node's metrics at http://ADDR:PORT/metrics (Prometheus text), on "
        "the node's own address only (the one it joins the job with)",
        "PORT",
        own=True,
    ),
)
del S

BY_DEST: dict[str, Setting] = {s.dest: s for s in SETTINGS}
# What each flag is when it is not given: what build_launch_spec fills in.
DEFAULTS: dict[str, Any] = {s.dest: s.default for s in SETTINGS}
# Flags rtrain accepts but does not act on, with the value that changes nothing.
IGNORED_DEFAULTS: dict[str, Any] = {s.dest: s.default for s in SETTINGS if not s.acted_on}


def default(name: str) -> Any:
    """The default of the flag --name (dashed), for the spec dataclasses."""
    return BY_DEST[name.replace("-", "_")].default


def markdown_table(own: bool | None = None) -> str:
    """The flags as a markdown table (own: rtrain's only, torchrun's only, or None: all)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        if own is not None and s.own != own:
            continue
        flag = f"`--{s.name} {s.value}`" if s.value else f"`--{s.name}`"
        if s.short:
            flag = f"`{s.short}`, {flag}"
        shown = "" if s.switch or s.default in (None, "") else f"`{s.default}`"
        rows.append(f"| {flag} | {shown} | {s.full_help} |")
    return "\n".join(rows) + "\n"
