"""The `rtrain plan` table, and what each of its figures means."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...core.planner.job import PipelineJob, Worker
from ...core.planner.report import Option
from .safe_text import plain

# (column, what it means and in which unit): the table's header and its caption.
COLUMNS = (
    ("option", "what to do about the failure set"),
    (
        "iteration time",
        "one training iteration in steady state (every micro-batch of every replica "
        "through every stage, and the optimizer step), in the unit of the durations: "
        "seconds for a measured --profile, else --forward's unit",
    ),
    (
        "throughput vs fault-free",
        "iterations per unit of time against 1F1B with every worker, in % "
        "(fault-free iteration time / this one); restart: the share of time left "
        "after restarts, 1 - failures per hour x restart cost / 3600 s",
    ),
    ("workers", "workers computing: DP x PP less the failed (dropped replicas: all of theirs)"),
    ("note", "how the option gets there"),
)


def print_comparison(job: PipelineJob, failed: list[Worker], options: list[Option]) -> None:
    title = (
        f"DP={job.dp} x PP={job.pp}, {job.microbatches} micro-batches per replica; "
        f"failed: {', '.join(f'{r}:{s}' for r, s in sorted(failed)) or 'none'}"
    )
    caption = "\n".join(f"{name}: {meaning}" for name, meaning in COLUMNS)
    table = Table(title=plain(title), caption=Text(caption), caption_justify="left")
    for column, _ in COLUMNS:
        table.add_column(column)
    for option in options:
        table.add_row(
            plain(option.name),
            "-" if option.iteration_time is None else f"{option.iteration_time:.2f}",
            "-" if option.throughput is None else f"{option.throughput:.1%}",
            str(option.workers),
            plain(option.note),
        )
    Console().print(table)
