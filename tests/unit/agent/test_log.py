"""The agent's log line: what it says of the node, and nothing it does not know yet."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from rtrain.agent.observe import log


@pytest.fixture
def context() -> Iterator[log.LogContext]:
    saved = log.CONTEXT
    log.CONTEXT = log.LogContext()
    yield log.CONTEXT
    log.CONTEXT = saved


def line(message: str) -> str:
    record = logging.LogRecord("rtrain.agent", logging.INFO, __file__, 1, message, (), None)
    assert log.ContextFilter().filter(record)
    return log.formatter().format(record)


def test_lines_before_rendezvous_carry_no_placeholders(context: log.LogContext) -> None:
    """Issue 31: `[rtrain 10:01:04.264 node- gen- WARNING]` before the first generation."""
    first = line("hosting the rendezvous store")
    assert first.endswith(" INFO] hosting the rendezvous store"), first
    assert "node-" not in first and "gen-" not in first and "  " not in first
    log.set_node("gpu-017")  # Slurm names the node before rendezvous numbers it
    assert " gpu-017 INFO] " in line("x")
    log.set_node_rank(2)
    log.set_generation(5)
    assert " node2 gen5 INFO] x" in line("x")
