"""Fixtures the agent's unit tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rtrain.agent.observe.events import EVENTS
from rtrain.core.observe.events import Event


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event this process emits while the test runs (no events file)."""
    seen: list[Event] = []
    EVENTS.listen(seen.append)
    try:
        yield seen
    finally:
        EVENTS.close()
