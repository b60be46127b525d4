"""RoundCloser: what a round's closer does, split from Rounds (rounds.py): charge the
previous generation's failure (once per closer and round; the ledger makes it once per
job), read the round's slots, leave out the excluded, write the membership once. What
it left out, and why, is kept for the round's timeout message."""

from __future__ import annotations

import functools
import logging
from collections.abc import Set

from ...core.clock import Clock
from ...core.config.component_specs import RendezvousPart
from ...core.errors import RendezvousError
from ...core.rendezvous.closing import LeftOut, closing_order, leave_out
from ...core.rendezvous.fault_history import demoted_members
from ...core.rendezvous.protocol import MemberInfo, Membership, ProtocolError, StoreKeys
from ..observe.events import emit
from ..store.kv import KeyValueStore
from .ledger import FailureLedger

logger = logging.getLogger(__name__)

POLL_S = 0.02
# A joiner takes its slot number and writes its slot a moment later.
SLOT_WRITE_GRACE_S = 5.0


class RoundCloser:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        part: RendezvousPart,
        ledger: FailureLedger,
        clock: Clock,
    ) -> None:
        self._store = store
        self._keys = keys
        self._part = part
        self._ledger = ledger
        self._clock = clock
        self._charged: set[int] = set()  # rounds whose previous failure this node charged
        self._said: set[tuple[int, str]] = set()  # (round, who) left out and logged
        self.left: dict[int, list[LeftOut]] = {}  # round -> its last close's left out

    def try_close(
        self,
        target: int,
        size: int,
        closer: str,
        joined: int | None = None,
        expected: Set[str] = frozenset(),
    ) -> None:
        """Close round `target` with `size` of its first `joined` slots (read in one
        request), less the excluded: the survivors of the last generation first, keeping
        their node ranks, then the others by slot in the lost nodes' ranks
        (closing.closing_order); nothing when too few are left (the round stays open)."""
        if target > 0 and target not in self._charged:
            self._charged.add(target)  # once: every pass of a round that cannot close
            try:
                before = len(read_membership(self._store, self._keys, target - 1).members)
            except RendezvousError:
                pass
            else:
                self._ledger.charge_root_cause(target - 1, before, closer)
        members, left = self._slots(target, max(size, joined or 0), SLOT_WRITE_GRACE_S)
        members, excluded = leave_out(members, self._ledger.exclusions([m.addr for m in members]))
        left += excluded
        self.left[target] = left
        for out in left:
            if (target, out.who) not in self._said:
                self._said.add((target, out.who))
                logger.warning("leaving %s out of round %d: %s", out.who, target, out.why)
        if min(len(members), size) < self._part.nodes.min_nodes:
            return
        history = self._ledger.history
        last = {} if history is None else history.flagged({m.addr for m in members})
        try:
            ordered = closing_order(members, size, expected, self._part.static, set(last))
        except ProtocolError as exc:
            raise RendezvousError(f"rendezvous of generation {target} failed: {exc}") from None
        closed = Membership(target, ordered)
        if self._store.set_once(self._keys.closed(target), closed.encode()) == closed.encode():
            self._said_standbys(target, members, ordered, last)

    def _said_standbys(
        self,
        target: int,
        members: list[MemberInfo],
        ordered: tuple[MemberInfo, ...],
        last: dict[str, int],
    ) -> None:
        """The joiners whose fault history made them standbys of this round: one line
        and one event each, by the closer whose close took."""
        for addr in demoted_members(
            [m.addr for m in members], [m.addr for m in ordered], set(last)
        ):
            logger.warning(
                "%s waits as a standby in round %d: %d fault(s) in its history's window",
                addr,
                target,
                last[addr],
            )
            emit("standby_by_history", host=addr, faults=last[addr], round=target)

    def left_out(self, target: int, joined: int) -> list[LeftOut]:
        """Who of round `target`'s first `joined` joiners a close would leave out now, and
        why (for its timeout: read once, whether or not this node tried to close it)."""
        members, left = self._slots(target, joined, 0.0)
        _, excluded = leave_out(members, self._ledger.exclusions([m.addr for m in members]))
        return left + excluded

    def _slots(
        self, target: int, size: int, grace_s: float
    ) -> tuple[list[MemberInfo], list[LeftOut]]:
        members: list[MemberInfo] = []
        left: list[LeftOut] = []
        grace_end = self._clock.now() + grace_s
        keys = [self._keys.slot(target, slot) for slot in range(1, size + 1)]
        # Every slot in one request; only a slot not written yet is waited for.
        payloads = self._store.multi_get(keys)
        for slot, (key, payload) in enumerate(zip(keys, payloads, strict=True), 1):
            if payload is None and grace_s > 0:
                self._clock.wait_until(
                    functools.partial(self._store.exists, key),
                    grace_end - self._clock.now(),
                    POLL_S,
                )
                payload = self._store.get(key)
            if payload is None:
                left.append(LeftOut(f"slot {slot}", "its slot was never written"))
                continue
            try:
                members.append(MemberInfo.decode(payload))
            except ProtocolError as exc:
                left.append(LeftOut(f"slot {slot}", f"refused: {exc}"))
        return members, left


def read_membership(store: KeyValueStore, keys: StoreKeys, generation: int) -> Membership:
    payload = store.get(keys.closed(generation))
    if payload is None:
        raise RendezvousError(f"generation {generation} has no membership in the store")
    try:
        return Membership.decode(payload, generation)
    except ProtocolError as exc:
        raise RendezvousError(
            f"refusing the membership of generation {generation} found in the store: {exc}"
        ) from None
