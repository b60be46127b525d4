"""The `rtrain plan` table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core.planner.job import PipelineJob, Worker
from ..core.planner.report import Option


def print_comparison(job: PipelineJob, failed: list[Worker], options: list[Option]) -> None:
    title = (
        f"DP={job.dp} x PP={job.pp}, {job.microbatches} micro-batches per replica; "
        f"failed: {', '.join(f'{r}:{s}' for r, s in sorted(failed)) or 'none'}"
    )
    table = Table(title=title)
    for column in ("option", "iteration time", "throughput vs fault-free", "workers", "note"):
        table.add_column(column)
    for option in options:
        table.add_row(
            option.name,
            "-" if option.iteration_time is None else f"{option.iteration_time:.2f}",
            "-" if option.throughput is None else f"{option.throughput:.1%}",
            str(option.workers),
            escape(option.note),
        )
    Console().print(table)
