"""RestartBudget: --max-restarts accounting, where the loss of another node is free.

A failure somewhere usually takes down workers on every node (their collectives lose
a partner). The store's restart claim already makes sure only the first reporter is
charged; this budget then refunds that charge when the next generation shows that a
node of the failed one is gone, because the loss of a peer is not this node's fault.
Pure: the agent hands in the memberships.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class RestartBudget:
    max_restarts: int
    used: int = 0
    # The generation whose failure was last charged here, until the next one settles it.
    charged_generation: int | None = None

    @property
    def exhausted(self) -> bool:
        return self.used >= self.max_restarts

    def charge(self, generation: int) -> None:
        self.used += 1
        self.charged_generation = generation

    def settle(self, previous: Collection[str], current: Collection[str], generation: int) -> bool:
        """Refund the charge for generation-1 if one of its nodes is missing from `generation`.

        previous/current: the node ids of the two generations. True if refunded.
        """
        charged, self.charged_generation = self.charged_generation, None
        if charged is None or charged != generation - 1:
            return False
        if set(previous) - set(current):
            self.used -= 1
            return True
        return False


# A generation that ran this long before failing resets the backoff.
RESTART_RESET_S = 60.0
RESTART_BACKOFF_CAP_S = 30.0


def restart_delay(quick_failures: int, base: float) -> float:
    """Seconds to wait before restarting after the quick_failures-th failure in a row
    that came within RESTART_RESET_S of a start: the first restart is immediate (a
    one-off crash costs nothing), then base, 2 x base, ... up to the cap."""
    if quick_failures <= 1 or base <= 0:
        return 0.0
    return min(base * 2 ** (quick_failures - 2), RESTART_BACKOFF_CAP_S)
