"""GenerationWatch: what a running generation reads from the store, and how rarely.

A running generation must see three changes made by others: the round moved past it
(it is fenced), the job was aborted, a node waits to be admitted. Each writer of one
of those also sets the generation's news key (StoreKeys.news), and the key is watched
by a blocking wait (KeyValueStore.notice), so a healthy agent reads none of the three
until something happened: at 2,048 nodes, polling the round every 0.25 s alone was
8,000 requests a second. A sweep reads them anyway every SWEEP_S, for a writer that
died between its change and the news.
"""

from __future__ import annotations

from ...core.clock import Clock
from ..waiting import SYSTEM_CLOCK
from .job_end import JobEndRecords
from .rounds import Rounds

SWEEP_S = 5.0


class GenerationWatch:
    def __init__(
        self,
        rounds: Rounds,
        ends: JobEndRecords,
        generation: int,
        room_to_grow: bool,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._rounds = rounds
        self._ends = ends
        self.generation = generation
        self._room_to_grow = room_to_grow
        self._clock = clock
        self._news = rounds.news(generation)
        self._next_sweep = clock.now()

    def due(self, force: bool = False) -> bool:
        """Whether to read the changes now: the news is set, a sweep is due, or force (a
        local worker failed: was the node fenced first?)."""
        now = self._clock.now()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            return True
        return force or self._news()

    def fenced(self) -> bool:
        """The round moved past this generation."""
        return self._rounds.round_moved_past(self.generation)

    def admits_waiting(self) -> bool:
        """Raises JobAborted if the job was aborted; whether a waiting node should be
        admitted (it is waiting and this generation has room for it)."""
        self._ends.raise_if_aborted()
        return self._room_to_grow and self._rounds.waiting_nodes(self.generation) > 0
