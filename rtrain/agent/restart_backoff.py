"""RestartBackoff: a node whose workers keep failing soon after a start waits before
the next restart (50 restarts in 7 s help nobody); a generation that ran for
RESTART_RESET_S before failing resets it. The delays are core.rendezvous.restart_budget's."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.clock import Clock
from ..core.rendezvous.restart_budget import RESTART_RESET_S, restart_delay
from .waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)


class RestartBackoff:
    def __init__(self, base: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._base = base
        self._clock = clock
        self._quick_failures = 0
        self._started = clock.now()

    def started(self) -> None:
        """A generation's workers are running."""
        self._started = self._clock.now()

    def healthy(self) -> None:
        """The generation ended without a failure of this node's workers."""
        self._quick_failures = 0

    def failed(self, check_stop: Callable[[], None]) -> None:
        """This node's workers failed: wait as long as the backoff says (signals end it)."""
        lived = self._clock.now() - self._started
        self._quick_failures = self._quick_failures + 1 if lived < RESTART_RESET_S else 1
        delay = restart_delay(self._quick_failures, self._base)
        if delay <= 0:
            return
        logger.warning(
            "the workers failed %d times in a row within %gs of starting; waiting %gs "
            "before restarting (--restart-backoff)",
            self._quick_failures,
            RESTART_RESET_S,
            delay,
        )

        def stopped() -> bool:
            check_stop()  # a signal ends the wait by raising
            return False

        self._clock.wait_until(stopped, delay, 0.1)
