"""KeptRanks: which ranks of a new generation are processes a repair in place kept alive,
as every node must know it before its workers start. Each node writes its own (the
global ranks of the new generation its parked workers take, possibly none) and reads
every member's; the union goes to every worker as RTRAIN_KEPT_RANKS
(core/contract/environment.py), so a kept worker knows whom it can train with at once
and a new one that it joins later (core/worker/repair/through.py)."""

from __future__ import annotations

from collections.abc import Callable

from ...core.clock import Clock
from ...core.contract.environment import decode_ranks, encode_ranks
from ...core.errors import RendezvousError
from ...core.rendezvous.keys import StoreKeys
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK
from .rounds import POLL_S
from .worker_store import WorkerStoreAddress


class KeptRanks:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        workers: WorkerStoreAddress,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._keys = keys
        self._workers = workers  # its raise_if_ended: a generation over while it starts
        self._clock = clock

    def exchange(
        self,
        generation: int,
        node_rank: int,
        num_nodes: int,
        mine: list[int],
        timeout_s: float,
        watch: Callable[[], object] | None = None,
    ) -> tuple[int, ...]:
        """Every member's kept ranks of `generation`, this node's `mine` among them;
        GenerationEnded if the generation is over first, RendezvousError if a member's
        never comes within timeout_s or one is not a list of ranks."""
        self._store.set(self._keys.kept(generation, node_rank), encode_ranks(mine))
        keys = [self._keys.kept(generation, n) for n in range(num_nodes)]
        found: list[bytes | None] = []

        def all_written() -> bool:
            found[:] = self._store.multi_get(keys)
            if all(value is not None for value in found):
                return True
            self._workers.raise_if_ended(generation, watch)
            return False

        if not self._clock.wait_until(all_written, timeout_s, POLL_S):
            missing = [n for n, value in enumerate(found) if value is None]
            raise RendezvousError(
                f"nodes {missing} did not say which workers they kept for generation "
                f"{generation} within {timeout_s:g}s"
            )
        kept: set[int] = set()
        for node, value in enumerate(found):
            ranks = decode_ranks((value or b"").decode("ascii", "replace"))
            if ranks is None:
                raise RendezvousError(
                    f"refusing node {node}'s kept ranks of generation {generation} in the store"
                )
            kept.update(ranks)
        return tuple(sorted(kept))
