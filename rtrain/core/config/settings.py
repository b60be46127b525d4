"""Every flag of `rtrain launch`, once: name, value, default, help, environment, check.

This table (torchrun's flags from torchrun_flags.py, then rtrain's own, below) is the
single source of the argparse parser (cli/launch_args.py), of the values
build_launch_spec checks (each row's check, core/config/checks.py) and fills in
(launch_spec.py) and the spec dataclasses' defaults, and of the flag tables in README.md
and docs/flags.md (scripts/settings_doc.py writes them; tests/unit/core/test_settings.py
fails when they drift). A new flag is one row here. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .checks import (
    CHOICE,
    COUNT,
    MODULES,
    ON_OFF,
    PORT,
    POSITIVE,
    SECONDS,
    SECONDS_OR_ZERO,
    SIZE,
    SWITCH,
    TEXT,
    optional,
)
from .setting_row import NOT_ACTED_ON, Setting
from .torchrun_flags import TORCHRUN_SETTINGS

__all__ = ["NOT_ACTED_ON", "SETTINGS", "Setting", "default", "markdown_table", "values"]

S = Setting
# rtrain's own flags (own=True), after torchrun's.
OWN_SETTINGS: tuple[Setting, ...] = (
    S(
        "preload",
        "torch",
        "modules the worker pool imports once so restarts skip them (comma list; `none` "
        "to disable)",
        "MODULES",
        underscore=False,
        own=True,
        check=MODULES,
    ),
    S(
        "dry-run",
        False,
        "print what rtrain resolved (nodes, rendezvous, fault settings, the DP x PP x TP "
        "grid) and exit",
        switch=True,
        own=True,
        check=SWITCH,
    ),
    S(
        "tp",
        1,
        "tensor-parallel size; each TP group stays on one node",
        "N",
        underscore=False,
        own=True,
        check=POSITIVE,
    ),
    S(
        "pp",
        1,
        "pipeline stages; DP = world size / (PP x TP)",
        "N",
        underscore=False,
        own=True,
        check=POSITIVE,
    ),
    S(
        "heartbeat-interval",
        1.0,
        "seconds between an agent's lease renewals",
        "S",
        own=True,
        check=SECONDS,
    ),
    S(
        "heartbeat-timeout",
        None,
        "seconds without a renewal before a node counts as lost (default 5, or "
        "`--rdzv-conf heartbeat_timeout=`)",
        "S",
        own=True,
        check=optional(SECONDS, (None,)),
    ),
    S(
        "hang-timeout",
        60.0,
        "seconds a worker may go without `rtrain.core.heartbeat()` after its first call "
        "before it counts as hung",
        "S",
        own=True,
        check=SECONDS,
    ),
    S(
        "first-heartbeat-timeout",
        None,
        "seconds a started worker may take to its first `rtrain.core.heartbeat()` before "
        "it counts as hung (a hang in `init_process_group` or a restore); off by default: "
        "set it only for a script that heartbeats, above its slowest start",
        "S",
        own=True,
        check=optional(SECONDS, (None,)),
    ),
    S(
        "snapshot-memory",
        None,
        "shared memory this node may use for snapshots and peers' replicas, e.g. `8G` "
        "(default: half of `/dev/shm`)",
        "SIZE",
        own=True,
        check=optional(SIZE),
    ),
    S(
        "snapshot-copies",
        2,
        "copies of each snapshot shard on distinct nodes, the original included",
        "N",
        own=True,
        check=POSITIVE,
    ),
    S(
        "snapshot-dp-delta",
        "on",
        "send a replica to a node that runs the shard's DP twin as only the chunks that "
        "twin's shard of the same step lacks (`off`: always the whole shard)",
        "MODE",
        choices=("on", "off"),
        own=True,
        check=ON_OFF,
    ),
    S(
        "checkpoint-dir",
        None,
        "disk checkpoints (shared by all nodes), read only when no copy of some shard "
        "survives in memory",
        "DIR",
        own=True,
        check=optional(TEXT),
        shown="none (no disk checkpoints)",
    ),
    S(
        "checkpoint-every",
        0,
        "write a disk checkpoint every N steps, in the background, from the in-memory "
        "snapshot (0: never)",
        "N",
        own=True,
        check=COUNT,
    ),
    S(
        "keep-checkpoints",
        3,
        "complete disk checkpoints kept in --checkpoint-dir: the step folders older than "
        "the newest K are deleted after each step written (0: keep all)",
        "K",
        own=True,
        check=COUNT,
    ),
    S(
        "secret-file",
        None,
        "the job secret that authenticates the agents' shard servers, in a file only you "
        "can read (mode 0600); `RTRAIN_SECRET` takes precedence; without either a random "
        "secret goes through the rendezvous store (see Security)",
        "FILE",
        own=True,
        check=optional(TEXT),
    ),
    S(
        "restart-backoff",
        1.0,
        "a node whose workers fail again within a minute of starting waits S, then 2S, "
        "... (up to 30 s) before the next restart; the first restart is immediate (0: "
        "never wait)",
        "S",
        own=True,
        check=SECONDS_OR_ZERO,
    ),
    S(
        "kill-process-tree",
        False,
        "when workers stop, also stop every process they started, detached ones included "
        "(torchrun leaves them running)",
        switch=True,
        own=True,
        check=SWITCH,
    ),
    S(
        "spares-per-node",
        0,
        "warm spare workers per node: each runs the script's start-up ahead of any fault "
        "and waits in rtrain.repairable to take a failed rank's place (on a GPU node, a "
        "free device each)",
        "N",
        own=True,
        check=COUNT,
    ),
    S(
        "stragglers",
        "detect",
        "slow ranks of a script that takes its data by rtrain.data_ranks(): `off`, "
        "`detect` (`straggler` events, rtrain status) or `balance` (detect, and move data "
        "shares off a slow rank, the global batch kept)",
        "MODE",
        choices=("off", "detect", "balance"),
        own=True,
        check=CHOICE,
    ),
    S(
        "replace-stragglers-after",
        0.0,
        "seconds a rank may stay a straggler before its node leaves the job, as for a GPU "
        "fault, for a standby to take its place (0: never)",
        "S",
        own=True,
        check=SECONDS_OR_ZERO,
    ),
    S(
        "max-node-failures",
        0,
        "exclude a node from the job once it was lost, or the root cause of a failure, N "
        "times (0: never)",
        "N",
        own=True,
        check=COUNT,
    ),
    S(
        "standby-after-faults",
        2,
        "a node charged N faults within --fault-window (this job's and, with "
        "--checkpoint-dir, earlier jobs' kept there) joins last, as a standby (0: never)",
        "N",
        own=True,
        check=COUNT,
    ),
    S(
        "fault-window",
        86400.0,
        "seconds of fault history --standby-after-faults counts (default one day)",
        "S",
        own=True,
        check=SECONDS,
    ),
    S(
        "net-probe",
        "4M",
        "bytes each agent sends its ring successor at start, on the state network, to "
        "measure its rate, at most 64M (0: no probe)",
        "SIZE",
        own=True,
        check=optional(SIZE, ("0", 0)),
    ),
    S(
        "health-interval",
        10.0,
        "run every GPU check every S seconds (XIDs are taken as they come; 0: off; nodes "
        "without an NVIDIA driver skip the checks)",
        "S",
        own=True,
        check=SECONDS_OR_ZERO,
    ),
    S(
        "drain-on-fault",
        False,
        "under Slurm, drain a node whose GPU fault takes it out of the job, with the "
        "failed check as the reason",
        switch=True,
        own=True,
        check=SWITCH,
    ),
    S(
        "recycle-profile",
        None,
        "a job profile (per-stage F/B/W/optimizer times, `microbatches`): every "
        "generation hands each worker its ReCycle action list "
        "(`rtrain.core.recycle_actions()`), the fault-free one until a loss",
        "FILE",
        own=True,
        check=optional(TEXT),
    ),
    S(
        "events",
        "on",
        "append structured events (generations, faults, restores, replication, GPU "
        "checks; JSON lines) to `events.jsonl` in the run's log folder (`off`: none)",
        "MODE",
        choices=("on", "off"),
        own=True,
        check=ON_OFF,
    ),
    S(
        "metrics-file",
        None,
        "keep this node's metrics in FILE in Prometheus text format, for node_exporter's "
        "textfile collector (rewritten whole as they change)",
        "FILE",
        own=True,
        check=optional(TEXT),
    ),
    S(
        "metrics-port",
        None,
        "serve this node's metrics at http://ADDR:PORT/metrics (Prometheus text) and a "
        "liveness probe at /healthz, on the node's own address only (the one it joins "
        "the job with)",
        "PORT",
        own=True,
        check=optional(PORT),
        shown="none (not served)",
    ),
    S(
        "log-format",
        "text",
        "rtrain's own log lines on the console: `text`, or `json` for log collectors (one "
        "object a line: time, level, logger, node, generation, message)",
        "FORMAT",
        choices=("text", "json"),
        own=True,
        check=CHOICE,
    ),
    S(
        "on-sigterm",
        None,
        "what a SIGTERM to the agent means: `leave` (this node leaves within 20 s and the "
        "others go on: a pod's eviction; the default under Kubernetes) or `end-job` (every "
        "node stops; the default elsewhere); under Slurm a SIGTERM saves and requeues",
        "MODE",
        choices=("end-job", "leave"),
        own=True,
        check=optional(CHOICE),
        shown="leave under Kubernetes (KUBERNETES_SERVICE_HOST set), else end-job",
    ),
)
del S

SETTINGS: tuple[Setting, ...] = (*TORCHRUN_SETTINGS, *OWN_SETTINGS)
BY_DEST: dict[str, Setting] = {s.dest: s for s in SETTINGS}
# What each flag is when it is not given: what build_launch_spec fills in.
DEFAULTS: dict[str, Any] = {s.dest: s.default for s in SETTINGS}
# Flags rtrain accepts but does not act on, with the value that changes nothing.
IGNORED_DEFAULTS: dict[str, Any] = {s.dest: s.default for s in SETTINGS if not s.acted_on}


def default(name: str) -> Any:
    """The default of the flag --name (dashed), as the table (and argparse) has it."""
    return BY_DEST[name.replace("-", "_")].default


def typed_default(name: str) -> Any:
    """The default of --name (dashed) as its check makes it, for the spec dataclasses."""
    return BY_DEST[name.replace("-", "_")].typed_default


def values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every flag's typed value, by dest: raw's (keyed by dest) or the default, through
    the row's check; the first bad value raises its UsageError."""
    return {s.dest: s.parse(raw.get(s.dest, s.default)) for s in SETTINGS}


def markdown_table(own: bool | None = None) -> str:
    """The flags as a markdown table (own: rtrain's only, torchrun's only, or None: all)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    rows += [s.markdown_row() for s in SETTINGS if own is None or s.own == own]
    return "\n".join(rows) + "\n"
