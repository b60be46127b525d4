"""`rtrain status`'s view: a rich table on a terminal, plain text otherwise, or JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ...core.observe.status import JobStatus
from .safe_text import plain, shown


def _step(value: int | None) -> str:
    return "-" if value is None else str(value)


def status_view(view: JobStatus, seconds: float | None = None) -> Group:
    if view.generation is None:
        head = f"job {shown(view.run_id)}: round {view.round} forming, {view.joined} node(s) joined"
    elif view.running:
        head = (
            f"job {shown(view.run_id)}: generation {view.generation} running on "
            f"{len(view.nodes)} node(s), step {_step(view.step)}"
        )
    else:
        head = (
            f"job {shown(view.run_id)}: round {view.round} forming ({view.joined} joined); "
            f"generation {view.generation} ran on {len(view.nodes)} node(s)"
        )
    took = "" if seconds is None else f" in {seconds * 1000:.0f} ms"
    parts: list = [Text(head, style="bold"), Text(f"{view.reads} store reads{took}", style="dim")]
    if view.nodes:
        nodes = Table(box=None, pad_edge=False)
        for column in ("node", "address", "seen (s ago)", "workers", "ranks: step", "snapshot"):
            nodes.add_column(column, overflow="fold")
        for n in view.nodes:
            record = n.status
            seen = "-" if n.age_s is None else f"{n.age_s:.1f}"
            steps = (
                " ".join(f"{r}:{_step(s)}" for r, s in zip(record.ranks, record.steps, strict=True))
                if record
                else "-"
            )
            snap = "-" if record is None or record.committed is None else str(record.committed)
            if record is not None and record.committed is not None:
                # None: no copy on a peer (a single node has none, or none sent yet)
                held = record.replicated
                snap += " (not replicated)" if held is None else f" (replicated {held})"
            seen_text = plain(seen + (f"  {n.problem}" if n.problem else ""))
            if n.problem:
                seen_text.stylize("red")
            nodes.add_row(
                str(n.node_rank), plain(n.addr, limit=80), seen_text, str(n.workers), steps, snap
            )
        parts.append(nodes)
    parts.extend(_stragglers(view))
    through = view.through
    if through is not None:  # a train-through stretch: its note, against this clock
        parts.append(plain(through.describe(time.time()), limit=None))
    repair = view.last_repair
    if repair is not None:
        parts.append(
            plain(
                f"last repair in place (after generation {repair.from_generation}): "
                f"{repair.describe()}",
                limit=None,
            )
        )
    scope = f"generations {view.failures_from}..{view.generation or view.round}"
    if view.failures:
        failures = Table(
            title=f"failures ({scope})", box=None, pad_edge=False, title_justify="left"
        )
        for column in ("generation", "at", "kind", "node", "rank", "role", "message"):
            failures.add_column(column, overflow="fold")
        for f in view.failures:
            when = time.strftime("%H:%M:%S", time.localtime(f.time))
            rank = "-" if f.rank is None else str(f.rank)
            where = plain(f"{f.node_rank} ({f.host})", limit=80)
            failures.add_row(
                str(f.generation), when, plain(f.kind), where, rank, plain(f.role), plain(f.message)
            )
        parts.append(failures)
    else:
        parts.append(Text(f"no failures ({scope})"))
    if view.fault_history:  # the nodes' faults, this job's and (--checkpoint-dir) before
        recent = view.fault_history[-8:]
        said = "; ".join(
            f"{e.host} {e.kind} {time.strftime('%m-%d %H:%M', time.localtime(e.time))}"
            for e in recent
        )
        parts.append(plain(f"fault history ({len(view.fault_history)}): {said}", limit=None))
    return Group(*parts)


def _stragglers(view: JobStatus) -> list[Text]:
    """A line for each rank found slow (docs/stragglers.md)."""
    lines = []
    for slow in view.stragglers:
        for_s = max(time.time() - slow["since"], 0.0)
        said = (
            f"straggler: rank {slow['rank']} on node {slow['node']}, "
            f"{slow['slower']:.2f}x slower than its peers for {for_s:.0f} s"
        )
        lines.append(plain(said, limit=None))
    return lines


def print_status(view: JobStatus, as_json: bool, seconds: float | None = None) -> None:
    if as_json:
        print(json.dumps(view.as_json(), indent=1))
        return
    Console().print(status_view(view, seconds))


def watch_status(read: Callable[[], JobStatus], interval: float, as_json: bool) -> None:
    """Refresh until Ctrl-C: in place on a terminal, one view after another otherwise."""
    console = Console()
    if as_json or not console.is_terminal:
        while True:
            print_status(read(), as_json)
            print(flush=True)
            time.sleep(interval)
    with Live(status_view(read()), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(status_view(read()), refresh=True)
