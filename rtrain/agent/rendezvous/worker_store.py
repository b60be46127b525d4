"""The workers' store of each generation: node 0 hosts it and publishes its address in
the rendezvous store; every other node waits for that address, and stops waiting as soon
as the generation is over (an abort, or the round moved on because a member died or
left while it started)."""

from __future__ import annotations

from collections.abc import Callable

from ...core.clock import Clock
from ...core.errors import RendezvousError
from ...core.rendezvous.protocol import ProtocolError, StoreKeys, decode_master, encode_master
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK
from .job_end import JobEndRecords
from .rounds import POLL_S, Rounds


class GenerationEnded(Exception):
    """The generation this node was starting is already over (a member died or left):
    not an error, the node rejoins at the next round."""


class WorkerStoreAddress:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        rounds: Rounds,
        ends: JobEndRecords,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._keys = keys
        self._rounds = rounds
        self._ends = ends
        self._clock = clock

    def publish(self, generation: int, host: str, port: int) -> None:
        self._store.set(self._keys.master(generation), encode_master(host, port))

    def wait(
        self, generation: int, timeout_s: float, watch: Callable[[], object] | None = None
    ) -> tuple[str, int]:
        """Node 0's address for this generation's workers; GenerationEnded if the
        generation is over first, RendezvousError if none comes within timeout_s."""
        key = self._keys.master(generation)

        def published() -> bool:
            if self._store.exists(key):
                return True
            self.raise_if_ended(generation, watch)
            return False

        if not self._clock.wait_until(published, timeout_s, POLL_S):
            raise RendezvousError(
                f"node 0 did not publish the worker store of generation {generation}"
            )
        try:
            return decode_master(self._store.get(key) or b"")
        except ProtocolError as exc:
            raise RendezvousError(
                f"refusing the worker store address in the store: {exc}"
            ) from None

    def raise_if_ended(self, generation: int, watch: Callable[[], object] | None) -> None:
        """While a generation starts: abort, or GenerationEnded once the round moved on
        (watch, the peers' lease check, moves it when a member died meanwhile)."""
        self._ends.raise_if_aborted()
        if watch is not None:
            watch()
        if self._rounds.round_moved_past(generation):
            raise GenerationEnded(f"generation {generation} ended before it started")
