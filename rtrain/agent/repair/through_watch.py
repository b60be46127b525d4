"""ThroughWatch: a train-through generation as this node sees it, for events and status.

Its kept workers say in their state files which group they train in (core/contract/
repair_files.py: "interim" while new ranks start up, "whole" once they joined). The
watch reads them at the monitor's store pace and writes the `train_through` event when
this node's kept ranks first train at reduced size (which ranks, whose data shares they
hold, who joins), and `full_size` when the whole group runs (this node's new ranks
joined, and how long the reduced stretch lasted): `rtrain report` counts that stretch
as reduced throughput, not lost time; `rtrain status` shows the note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...core.contract.repair_files import INTERIM, RUNNING, WHOLE
from ...core.observe.through import ThroughNote
from ...core.repair.shares import assign_shares
from ..observe.events import emit
from ..workers.records import Worker
from .control import WorkerControl


class ThroughWatch:
    def __init__(
        self,
        control: Callable[[int], WorkerControl],
        generation: int,
        kept: tuple[int, ...],
        world: int,
        wall: Callable[[], float],
    ) -> None:
        self._control = control
        self._generation = generation
        self._kept = kept
        self._joining = tuple(r for r in range(world) if r not in kept)
        self._world = world
        self._wall = wall
        self._note: ThroughNote | None = None

    @property
    def active(self) -> bool:
        """Whether there is anything to watch: some ranks kept, some new."""
        return bool(self._kept) and bool(self._joining)

    def see(self, workers: Sequence[Worker]) -> ThroughNote | None:
        """Read the running workers' groups; the note (None: no reduced stretch seen)."""
        if not self.active or (self._note is not None and self._note.full):
            return self._note
        groups = {}
        for worker in workers:
            if worker.exitcode is not None:
                continue
            state = self._control(worker.local_rank).state()
            if state is None or (state.generation, state.pid) != (self._generation, worker.pid):
                continue
            if state.state == RUNNING:
                groups[worker.rank] = state.group
        if self._note is None and INTERIM in groups.values():
            self._began()
        # A worker of this generation in the whole group: the join happened (a kept
        # one says so only after its interim, which may have been too short to see).
        if WHOLE in groups.values():
            self._joined(groups)
        return self._note

    def _joiners(self, groups: dict[int, str]) -> list[int]:
        return sorted(r for r, group in groups.items() if r in self._joining and group == WHOLE)

    def _began(self) -> None:
        shares = assign_shares(self._world, self._kept)
        self._note = ThroughNote(self._kept, self._joining, shares, self._wall())
        emit(
            "train_through",
            kept=list(self._kept),
            joining=list(self._joining),
            shares={str(r): list(held) for r, held in shares.items()},
        )

    def _joined(self, groups: dict[int, str]) -> None:
        now = self._wall()
        since = self._note.since if self._note is not None else None
        emit(
            "full_size",
            joined=self._joiners(groups),
            reduced_s=None if since is None else round(now - since, 6),
        )
        if self._note is not None:
            self._note = ThroughNote(
                self._note.kept, self._note.joining, self._note.shares, self._note.since, True
            )
        else:  # a node of new ranks alone: it saw no reduced stretch of its own
            self._note = ThroughNote(self._kept, self._joining, {}, now, True)
