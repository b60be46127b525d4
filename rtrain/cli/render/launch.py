"""Rendering for `rtrain launch`: the failure report, the recovery report and the line
that says a job succeeded, and the --dry-run summary."""

from __future__ import annotations

import datetime
import shlex
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...agent.state import RunResult
from ...agent.store.store_host import HostChoice
from ...core.config.launch_spec import LaunchSpec
from ...core.config.slurm.env import SlurmJob
from ...core.config.worker_env import flight_recorder_named
from ...core.layout.topology import LayoutError, NodeSlot, build_grid
from ...core.observe.events import EVENTS_FILE, read_events
from ...core.observe.report import Report, build_report
from ...core.rendezvous.failures import FailureKind, FailureRecord, failure_roles
from .safe_text import plain, shown


def _when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).strftime("%H:%M:%S.%f")[:-3]


def report_console() -> Console:
    """stderr; logs and CI are not terminals, and 80 columns would fold the table."""
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=140)
    return console


def failure_report(
    console: Console, script: str, failures: list[FailureRecord], message: str
) -> None:
    """torchrun's FAILED summary as a table: the root cause (earliest failure) first, its
    victims marked."""
    _failure_table(console, f"{shown(script)} FAILED", "bold red", failures)
    _flight_recorder_dumps(console, failures)
    root = failures[0] if failures else None
    if root is not None and root.traceback:
        head = Text.assemble((f"Traceback of rank {root.rank}", "bold"), " (")
        console.print(head + plain(root.error_file) + Text("):"))
        console.print(plain(root.traceback.rstrip(), limit=None))
    _hung_stacks(console, failures[1:])
    console.print(Text.assemble(("rtrain:", "red"), " ") + plain(message, limit=None))


def recovery_hint(console: Console, max_restarts: int) -> None:
    """The last lines of a job that a fault ended: what would have kept it going (it
    ran with --max-restarts={max_restarts}, torchrun's default being 0)."""
    console.print(
        Text.assemble(
            ("rtrain:", "red"),
            " to keep such a job going: ",
            ("--max-restarts=N", "bold"),
            f" restarts the workers after a fault (this run: {max_restarts}); ",
            ("rtrain.snapshot()", "bold"),
            " and ",
            ("rtrain.restore()", "bold"),
            " resume them from the newest step in peers' memory, not from step 0; ",
            ("@rtrain.repairable", "bold"),
            " keeps the survivors' processes. See docs/quickstart.md, 'Survive a crash'.",
        )
    )


def recovery_report(
    console: Console, script: str, failures: list[FailureRecord], generations: int
) -> None:
    """After a job that succeeded despite faults: what happened, and what rtrain did.
    generations: how many ran (the last one's number + 1)."""
    roots = failure_roles(failures).count("root cause")
    title = f"{shown(script)} succeeded after {_count(len(failures), 'failure')}"
    if roots != len(failures):
        title += f" ({_count(roots, 'root cause')})"
    title += f"; {_count(generations, 'generation')} ran"
    _failure_table(console, title, "bold yellow", failures)
    _flight_recorder_dumps(console, failures)
    _hung_stacks(console, failures)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def success_line(script: str, result: RunResult) -> str:
    """The last line of a job that succeeded: the step it reached, its wall time, the
    faults it survived (its incidents: generations that ended in failures) and the
    command that reports it, from the RunResult and this node's events (where written)."""
    report = run_report(result.run_log_dir)
    said = []
    if report is not None and report.final_step is not None:
        said.append(f"reached step {report.final_step}")
    if report is not None and report.wall_s > 0:
        said.append(f"{report.wall_s:.1f} s wall time")
    said.append(_survived(result, report))
    line = f"{shown(script)} succeeded: {', '.join(said)}"
    if report is not None:
        line += f"; see: rtrain report {shown(shlex.quote(result.run_log_dir), None)}"
    return line


def _survived(result: RunResult, report: Report | None) -> str:
    """The faults the job survived: counted from the job's failure history, which node 0
    reads; another node, which has none, says how many generations its events show."""
    incidents = len({f.generation for f in result.failures})
    if incidents:
        return f"{_count(incidents, 'fault')} survived over " + _count(
            result.generation + 1, "generation"
        )
    generations = max(result.generation + 1, report.generations if report is not None else 0)
    if generations > 1:  # not node 0: the faults are in node 0's summary and the report
        return f"{_count(generations, 'generation')} ran (the faults: node 0's summary)"
    return "no fault"


def run_report(run_log_dir: str) -> Report | None:
    """The report of this node's events (None: it wrote none: --events off)."""
    path = Path(run_log_dir) / EVENTS_FILE
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            events, _ = read_events(handle)
    except OSError:
        return None
    return build_report(events) if events else None


def _flight_recorder_dumps(console: Console, failures: list[FailureRecord]) -> None:
    """The NCCL flight recorder's dumps a failure left (the table cuts long messages)."""
    for record in failures:
        for dump in flight_recorder_named(record.message):
            head = Text(f"Flight recorder dump of rank {record.rank}: ", style="bold")
            # soft_wrap: a path split across lines cannot be copied or searched for
            console.print(head + plain(dump, limit=None), soft_wrap=True)


def _hung_stacks(console: Console, failures: list[FailureRecord]) -> None:
    for record in failures:
        if record.kind == FailureKind.HANG and record.traceback:
            console.print(Text(f"Stack of hung rank {record.rank}:", style="bold"))
            console.print(plain(record.traceback.rstrip(), limit=None))


def _failure_table(console: Console, title: str, style: str, failures: list[FailureRecord]) -> None:
    table = Table(title=Text(title), title_style=style, show_lines=False)
    for column in ("", "time", "gen", "kind", "node", "host", "rank (local)", "exit", "pid"):
        table.add_column(column, no_wrap=True)
    table.add_column("error")
    # each generation's root cause (the first row is one), and the ranks whose collective
    # broke under it: its victims
    for record, role in zip(failures, failure_roles(failures), strict=True):
        rank = "" if record.rank is None else f"{record.rank} ({record.local_rank})"
        table.add_row(
            role,
            _when(record.time),
            str(record.generation),
            record.kind.value,
            str(record.node_rank),
            plain(record.host, limit=64),
            rank,
            record.describe_exit(),
            "" if record.pid is None else str(record.pid),
            plain(record.summary()),
        )
    console.print(table)


def dry_run(
    console: Console,
    spec: LaunchSpec,
    nproc: int,
    took: list[str] | None = None,
    store_host: HostChoice | None = None,
    no_gpu_checks: str | None = None,
    state_net: str = "",
) -> None:
    """store_host: which node hosts the job's TCPStore and why (None over etcd);
    no_gpu_checks: why this node will run no GPU checks (no NVML), if it will not;
    state_net: the interface replicas and restores will use (agent/net/probe.py)."""
    table = Table(title="rtrain launch --dry-run", show_header=False)
    table.add_column("setting", style="bold")
    table.add_column("value")
    rdzv = spec.rdzv
    nodes = spec.nodes
    rows = [
        (
            "nodes",
            str(nodes.max_nodes)
            if not nodes.is_elastic
            else f"{nodes.min_nodes}:{nodes.max_nodes}",
        ),
        ("node rank", "assigned at rendezvous" if spec.node_rank is None else str(spec.node_rank)),
        ("processes per node", str(nproc)),
        (
            "rendezvous",
            f"{rdzv.backend} {','.join(f'{h}:{p}' for h, p in rdzv.endpoints)}"
            + (f" ({rdzv.protocol})" if rdzv.is_etcd else "")
            + (" (standalone)" if spec.standalone else ""),
        ),
        *([("store host", _store_host(store_host))] if store_host else []),
        ("run id", rdzv.run_id),
        ("join timeout", f"{rdzv.join_timeout:g}s"),
        ("max restarts", str(spec.max_restarts)),
        (
            "entry point",
            f"{spec.entrypoint.kind}: {spec.entrypoint.target} {' '.join(spec.entrypoint.args)}",
        ),
        ("log dir", spec.log_dir or "(temporary)"),
        ("preload", ",".join(spec.preload) or "none"),
        (
            "leases",
            f"renewed every {spec.faults.heartbeat_interval:g}s, "
            f"node lost after {spec.faults.heartbeat_timeout:g}s",
        ),
        ("hang timeout", f"{spec.faults.hang_timeout:g}s after a worker's first heartbeat()"),
        (
            "first heartbeat",
            "no limit"
            if spec.faults.first_heartbeat_timeout is None
            else f"due {spec.faults.first_heartbeat_timeout:g}s after a worker starts",
        ),
        (
            "max node failures",
            str(spec.faults.max_node_failures or "unlimited (no node is excluded)"),
        ),
        ("standby after faults", _history(spec)),
        ("GPU health", _gpu_checks(spec, no_gpu_checks)),
        *([("state network", state_net)] if state_net else []),
    ]
    if spec.slurm is not None:
        rows.insert(0, ("Slurm", _slurm(spec.slurm, took)))
    for name, value in rows:
        table.add_row(name, plain(value, limit=None))
    console.print(table)
    layout_table(console, spec, nproc)


def _slurm(job: SlurmJob, took: list[str] | None) -> str:
    return (
        f"job {job.job_id}, nodes {','.join(job.nodes)}, this node "
        f"{job.nodes[job.node_id]} (SLURM_NODEID={job.node_id}), requeued "
        f"{job.restart_count} time(s); took: {'; '.join(took or []) or 'nothing'}"
    )


def _history(spec: LaunchSpec) -> str:
    faults = spec.faults
    if not faults.standby_after_faults:
        return "off"
    kept = spec.snapshots.checkpoint_dir or "this job's store only (no --checkpoint-dir)"
    return f"{faults.standby_after_faults} faults within {faults.fault_window:g}s; kept in {kept}"


def _gpu_checks(spec: LaunchSpec, missing: str | None) -> str:
    if spec.health.interval <= 0:
        return "off (--health-interval=0)"
    if missing is not None:
        return f"no GPU checks: {missing}"
    drain = "; drain on fault (Slurm)" if spec.health.drain_on_fault else ""
    return f"every check every {spec.health.interval:g}s, XIDs at once{drain}"


def _store_host(choice: HostChoice) -> str:
    hosts = {True: "this node", False: "another node", None: "this node (if its port is free)"}
    return f"{hosts[choice.hosts]}: {choice.reason}"


def layout_table(console: Console, spec: LaunchSpec, nproc: int) -> None:
    """The grid for the full node count, as the agents will compute it (first 64 ranks)."""
    nodes = [NodeSlot(f"node{i}", nproc) for i in range(spec.nodes.max_nodes)]
    try:
        topo = build_grid(spec.layout, 0, nodes)
    except LayoutError as exc:
        console.print(Text.assemble(("layout:", "red"), " ") + plain(exc, limit=None))
        return
    table = Table(title=plain(f"layout at {spec.nodes.max_nodes} nodes: {topo.summary()}"))
    for column in ("rank", "node", "dp", "pp", "tp", "tp group", "dp peers"):
        table.add_column(column, justify="right")
    for coord in topo.coords[:64]:
        spare = coord.dp is None
        table.add_row(
            str(coord.rank),
            str(coord.node_rank),
            "spare" if spare else str(coord.dp),
            "" if spare else str(coord.pp),
            "" if spare else str(coord.tp),
            "" if spare else _ranks(topo.tp_group(coord.rank)),
            "" if spare else _ranks(topo.dp_group(coord.rank)),
        )
    if topo.world_size > 64:
        table.caption = f"... {topo.world_size - 64} more ranks"
    console.print(table)


def _ranks(ranks: tuple[int, ...]) -> str:
    text = ",".join(map(str, ranks))
    return text if len(text) <= 40 else text[:37] + "..."
