"""One logger per module, and one context (node, generation) stamped on every line.

--log-format json writes each line as one JSON object instead (what log collectors
read): {"time": ISO 8601 UTC, "level", "logger", "node": the node's rank or null,
"host": its name before rendezvous (Slurm's), "generation": or null, "message"}.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from dataclasses import dataclass


@dataclass
class LogContext:
    """`node<rank>` and `gen<generation>` once rendezvous has given them; before, a line
    carries only what is known (a Slurm host name, or nothing), never a placeholder.
    The numbers themselves go into every structured event (agent/events.py)."""

    node: str = ""
    generation: str = ""
    node_rank: int | None = None
    generation_number: int | None = None

    @property
    def where(self) -> str:
        """What a line's header says of this node: `node0 gen3`, empty before rendezvous."""
        return "".join(f" {part}" for part in (self.node, self.generation) if part)


CONTEXT = LogContext()


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rtrain_where = CONTEXT.where
        return True


def formatter() -> logging.Formatter:
    """rtrain's line: `[rtrain 12:00:01.234 node0 gen3 INFO] message`."""
    return logging.Formatter(
        "[rtrain %(asctime)s.%(msecs)03d%(rtrain_where)s %(levelname)s] %(message)s",
        datefmt="%H:%M:%S",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line, the context as fields (never inside the message)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line: dict[str, object] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "node": CONTEXT.node_rank,
            "generation": CONTEXT.generation_number,
            "message": message,
        }
        if CONTEXT.node_rank is None and CONTEXT.node:
            line["host"] = CONTEXT.node
        return json.dumps(line, ensure_ascii=False)


LOG_FORMATS = ("text", "json")


def set_node(node: str) -> None:
    """A name for this node before rendezvous numbers it (Slurm's host name)."""
    CONTEXT.node = node


def set_node_rank(node_rank: int) -> None:
    CONTEXT.node, CONTEXT.node_rank = f"node{node_rank}", node_rank


def set_generation(generation: int) -> None:
    CONTEXT.generation, CONTEXT.generation_number = f"gen{generation}", generation


def configure(level: str | None = None, log_format: str = "text") -> None:
    """Send rtrain's own log lines to stderr, as text or (log_format json) one JSON object
    a line; LOGLEVEL works as it does for torchrun."""
    root = logging.getLogger("rtrain")
    if getattr(root, "_rtrain_configured", False):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else formatter())
    root.addHandler(handler)
    root.setLevel((level or os.environ.get("LOGLEVEL") or "INFO").upper())
    root.propagate = False
    root._rtrain_configured = True  # type: ignore[attr-defined]
