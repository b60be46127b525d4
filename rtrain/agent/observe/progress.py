"""Progress of the agent's long waits: a rendezvous short of nodes, a restore of large
shards, the disk checkpoint written at Slurm's SIGUSR1.

A wait that ends within QUIET_S shows nothing. A longer one shows, on a terminal, one
live line (rich) under the log; otherwise (a batch job's log file) a plain log line
every EVERY_S at most, in the agent's usual format, so that a log reader sees that the
wait moves, on what it waits and for how long so far. The last state is logged when
the wait ends either way.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ...core.clock import Clock
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

QUIET_S = 2.0  # a wait shorter than this shows nothing
EVERY_S = 5.0  # plain lines: at most one per this many seconds
REFRESH_S = 0.5  # the live line on a terminal


class WaitProgress:
    """One long wait: call update() as it moves (as often as it likes), close() at its end."""

    def __init__(
        self,
        what: str,
        clock: Clock = SYSTEM_CLOCK,
        terminal: bool | None = None,
        log: logging.Logger = logger,
    ) -> None:
        self.what = what
        self._clock = clock
        self._started = clock.now()
        self._next_line = self._started + QUIET_S
        self._terminal = sys.stderr.isatty() if terminal is None else terminal
        self._log = log
        self._live: Any = None  # rich's Progress, once the wait is long enough
        self._task: Any = None
        self._text = ""
        self._closed = False
        self.lines = 0  # plain lines written (for tests and the benchmark)

    def update(
        self, text: str | Callable[[], str], done: float | None = None, total: float | None = None
    ) -> None:
        """text: what the wait is at, or a function that says it (called only when the
        line is due: saying it may cost a store read)."""
        now = self._clock.now()
        if now < self._next_line:
            if isinstance(text, str):
                self._text = text
            return
        self._next_line = now + (REFRESH_S if self._terminal else EVERY_S)
        self._text = text if isinstance(text, str) else text()
        if self._terminal:
            self._show(self._text, done, total)
        else:
            self._log.info("%s: %s (%.0fs so far)", self.what, self._text, now - self._started)
            self.lines += 1

    def _show(self, text: str, done: float | None, total: float | None) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._live = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[text]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._live.start()
            self._task = self._live.add_task(self.what, total=None, text="")
        self._live.update(self._task, completed=done or 0, total=total, text=text)

    def finish(self, text: str) -> None:
        """The wait is over, and this is how it ended."""
        self._text = text
        self.close()

    def close(self) -> None:
        """The wait is over: the live line goes; a wait that showed anything logs its end."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
        waited = self._clock.now() - self._started
        if waited >= QUIET_S and self._text:
            self._log.info("%s: %s (after %.1fs)", self.what, self._text, waited)

    def __enter__(self) -> WaitProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
