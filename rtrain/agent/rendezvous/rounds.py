"""Rounds: agents agree on each generation's membership through the store.

The protocol (keys, validation, ordering and closing rules) lives in
rtrain.core.rendezvous.protocol; this class only performs it against a live store.
Only non-blocking store calls are used, so the agent stays responsive to signals;
every wait is core.clock.wait_until on the agent's clock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ...core.clock import Clock
from ...core.config.component_specs import RendezvousPart
from ...core.errors import JobFinished, RendezvousError, RendezvousTimeout
from ...core.rendezvous.closing import (
    BACKUP_CLOSE_S,
    FOLLOWER_POLL_S,
    check_close,
    look_now,
    role,
    round_timeout,
    start_closing,
)
from ...core.rendezvous.protocol import (
    MemberInfo,
    Membership,
    ProtocolError,
    StoreKeys,
    decode_int,
)
from ..observe.progress import WaitProgress
from ..store.kv import KeyValueStore, decode_counter, increment
from ..waiting import SYSTEM_CLOCK
from .job_end import JobEndRecords
from .ledger import FailureLedger
from .round_close import RoundCloser, read_membership

logger = logging.getLogger(__name__)

POLL_S = 0.02
WAITING_CHECK_S = 1.0
# A spare's look at the running generation without news: the round, the abort record,
# whether the job finished (GenerationWatch.SWEEP_S, a running node's sweep).
SPARE_SWEEP_S = 5.0


class Rounds:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        part: RendezvousPart,
        ledger: FailureLedger,
        ends: JobEndRecords,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._part = part
        self._keys = keys
        self._ledger = ledger
        self._ends = ends
        self._clock = clock
        # What a running generation checks on every pass, read through the store's
        # watches where it has them (etcd): no store traffic per check.
        self._round_now: Callable[[], bytes | None] | None = None
        self._waiting: tuple[int, Callable[[], bytes | None]] | None = None
        self._waiting_seen: tuple[int, float] = (0, float("-inf"))  # count, next read
        self._slot_ids: dict[int, dict[int, str]] = {}
        self._last_seen: Callable[[str], float | None] | None = None  # the join under way
        self._closer = RoundCloser(store, keys, part, ledger, clock)

    # -- the round counter --

    def current_round(self) -> int:
        # One round trip: creates the counter at "0" if missing, else returns its value.
        try:
            return decode_int(self._store.set_once(self._keys.round, "0"), "round counter")
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's state in the store: {exc}") from None

    def open_next_round(self, generation: int) -> None:
        """Advance the job from `generation` to the next one (idempotent across agents)."""
        self._store.compare_set(self._keys.round, str(generation), str(generation + 1))
        self._store.set(self._keys.news(generation), "round")

    def news(self, generation: int) -> Callable[[], bool]:
        """Whether the generation's news key is set (StoreKeys.news): a running
        generation checks it every pass and reads the round, the abort record and the
        waiting nodes only once it is set, or on a slow sweep."""
        return self._store.notice(self._keys.news(generation))

    def round_moved_past(self, generation: int) -> bool:
        if self._round_now is None:
            self._round_now = self._store.follow(self._keys.round)
        payload = self._round_now()
        if payload is None:  # not created yet: create it, as every reader of it does
            return self.current_round() > generation
        return decode_counter(payload, "round counter") > generation

    def waiting_nodes(self, generation: int) -> int:
        """Agents that joined the next round while this generation runs; read at most
        every WAITING_CHECK_S (a node waiting to be admitted can wait a second)."""
        now = self._clock.now()
        if self._waiting is None or self._waiting[0] != generation:
            self._waiting = (generation, self._store.follow(self._keys.joins(generation + 1)))
            self._waiting_seen = (0, float("-inf"))
        count, next_read = self._waiting_seen
        if now >= next_read:
            count = decode_counter(self._waiting[1](), "join counter")
            self._waiting_seen = (count, now + WAITING_CHECK_S)
        return count

    # -- joining --

    def join(
        self,
        member: MemberInfo,
        check_stop: Callable[[], None] | None = None,
        expected: Callable[[], set[str]] | None = None,
        last_seen: Callable[[str], float | None] | None = None,
        on_standby: Callable[[], None] | None = None,
    ) -> Membership:
        """Block until a generation closes with this node in it; raise on timeout or abort.

        expected: the node ids known to be coming (the previous generation's survivors),
        asked on every pass so that a peer found dead meanwhile stops being waited for.
        last_seen: seconds since a node id was last seen alive, for the progress lines.
        on_standby: called when this node waits in the round after a running generation
        (a hot spare, beyond max_nodes: it gets ready to take over a lost node's ranks).
        """
        self._last_seen = last_seen
        deadline = self._clock.now() + self._part.join_timeout
        while True:
            current = self.current_round()
            target = current + 1 if self._store.exists(self._keys.closed(current)) else current
            slot = increment(self._store, self._keys.joins(target))
            self._store.set(self._keys.slot(target, slot), member.encode())
            logger.info("joined round %d as slot %d (this node: %s)", target, slot, member.addr)
            spare = target > current
            if spare:
                running = self._announce_waiting(current)
                if on_standby is not None:
                    on_standby()
                self._wait_as_spare(current, running, deadline, check_stop)
            membership = self._await_close(
                target, slot, member, deadline, check_stop, expected, spare
            )
            if membership is not None:
                return membership
            self._ledger.raise_if_excluded(member.addr)
            logger.info("round %d closed without this node; waiting for the next", target)

    def _announce_waiting(self, running: int) -> int | None:
        """Wake the running generation's members if they have room to admit this node;
        with none (hot spares at max_nodes) they are left alone, not polling for it.
        Returns the running generation's size (None: not found)."""
        membership = self.closed_membership(running)
        if membership is None:
            return None
        if len(membership.members) < self._part.nodes.max_nodes:
            self._store.set(self._keys.news(running), "waiting")
        return len(membership.members)

    def _wait_as_spare(
        self,
        running: int,
        size: int | None,
        deadline: float,
        check_stop: Callable[[], None] | None,
    ) -> None:
        """A node that joined the round after `running` waits for that round to open as
        a running node waits for news: on the running generation's news key (a blocking
        wait on TCPStore, a watch on etcd: no request while it stays unset), reading the
        round, the abort record and the job's end only once it is set (then at most
        every BACKUP_CLOSE_S) or every SPARE_SWEEP_S. Never the membership, the join
        counter or the slots: a spare costs the store no more than a running node."""
        news = self._store.notice(self._keys.news(running))
        last_look = self._clock.now()

        def opened() -> bool:
            nonlocal last_look
            if check_stop is not None:
                check_stop()
            now = self._clock.now()
            if now < last_look + SPARE_SWEEP_S and not (
                now >= last_look + BACKUP_CLOSE_S and news()
            ):
                return False
            last_look = now
            self._ends.raise_if_aborted()
            if self.round_moved_past(running):
                return True
            self._raise_if_finished(running, size)
            return False

        # Past the deadline: _await_close raises the round's timeout.
        self._clock.wait_until(opened, deadline - self._clock.now(), FOLLOWER_POLL_S)

    def _await_close(
        self,
        target: int,
        slot: int,
        member: MemberInfo,
        deadline: float,
        check_stop: Callable[[], None] | None,
        expected: Callable[[], set[str]] | None,
        spare: bool = False,
    ) -> Membership | None:
        nodes = self._part.nodes
        closed: list[Membership | None] = []
        sizes: list[int] = []  # of the membership that closed the round
        joined = 0
        # Who checks the closing rules, when, and what it found (core closing.py).
        part = role(slot, nodes.max_nodes, POLL_S, spare)
        closing = start_closing(part, self._clock.now())
        is_closed = self._store.notice(self._keys.closed(target))
        progress = WaitProgress("rendezvous", self._clock, log=logger)

        def settled() -> bool:
            nonlocal joined, closing
            self._ends.raise_if_aborted()
            if check_stop is not None:
                check_stop()
            membership = self.closed_membership(target) if is_closed() else None
            if membership is not None:
                inside = membership.node_rank_of(member.node_id) is not None
                closed.append(membership if inside else None)
                sizes.append(len(membership.members))
                return True
            closing, look = look_now(closing, part, self._clock.now())
            if not look:
                return False
            self._raise_if_finished(target - 1)
            joined = self._store.counter(self._keys.joins(target))
            progress.update(lambda: self._joined_text(target, joined, slot == 1, expected))
            current = self.current_round()
            if current > target:  # moved past it unclosed: a store carried over (agent/kube)
                closed.append(None)
                sizes.append(0)
                return True
            if current == target:
                closing, size = check_close(
                    closing,
                    part,
                    self._clock.now(),
                    joined,
                    nodes.min_nodes,
                    nodes.max_nodes,
                    self._part.last_call_timeout,
                    *self._survivors_in(target, joined, expected),
                )
                if size is not None:
                    alive = expected() if expected is not None else set()
                    self._try_close(target, size, member.node_id, joined, alive)
            return False

        with progress:
            if self._clock.wait_until(settled, deadline - self._clock.now(), part.poll):
                ended = closed[-1]
                without = "" if ended is not None else ", without this one"
                progress.finish(f"round {target} closed with {sizes[-1]} nodes{without}")
                return ended
        # Whom a close would leave out, and why, read once: this node too (excluded while
        # it waited), else every node's timeout says what none of them could see.
        self._ledger.raise_if_excluded(member.addr)
        left_out = self._closer.left_out(target, joined) if joined >= nodes.min_nodes else []
        timeout = self._part.join_timeout
        raise RendezvousTimeout(
            round_timeout(target, joined, nodes.min_nodes, timeout, left_out), target
        )

    def _joined_text(
        self, target: int, joined: int, names: bool, expected: Callable[[], set[str]] | None
    ) -> str:
        """How far the round is; the first joiner also names the previous generation's
        survivors it still waits for (reading the slots once: one joiner, not all)."""
        nodes = self._part.nodes
        want = (
            f"{nodes.min_nodes}"
            if nodes.min_nodes == nodes.max_nodes
            else (f"{nodes.min_nodes}-{nodes.max_nodes}")
        )
        text = f"{joined} of {want} nodes joined round {target}"
        if names and expected is not None:
            missing = sorted(expected() - self._joined_ids(target, joined))
            if missing:
                text += f", waiting for {', '.join(self._named(n) for n in missing[:8])}"
                text += f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        return text

    def _named(self, node_id: str) -> str:
        seen = self._last_seen(node_id) if self._last_seen is not None else None
        return node_id if seen is None else f"{node_id} (last seen {seen:.1f} s ago)"

    def _wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        return self._clock.wait_until(predicate, timeout, POLL_S)

    def _survivors_in(
        self, target: int, joined: int, expected: Callable[[], set[str]] | None
    ) -> tuple[bool, bool]:
        """Whether every expected node has joined, and whether some expected node has not
        (both False: none expected); slots are read only once enough have."""
        if expected is None or joined < self._part.nodes.min_nodes:
            return False, False
        alive = expected()
        if not alive:
            return False, False
        every = joined >= len(alive) and alive <= self._joined_ids(target, joined)
        return every, not every

    def _joined_ids(self, target: int, joined: int) -> set[str]:
        """The node ids in slots 1..joined; a slot once written never changes, so each
        is read once (kept per round), not on every pass."""
        known = self._slot_ids.setdefault(target, {})
        missing = [slot for slot in range(1, joined + 1) if slot not in known]
        if missing:
            payloads = self._store.multi_get([self._keys.slot(target, s) for s in missing])
            for slot, payload in zip(missing, payloads, strict=True):
                # Garbage is refused with a log line when the round closes.
                if payload is not None:
                    with contextlib.suppress(ProtocolError):
                        known[slot] = MemberInfo.decode(payload).node_id
        return set(known.values())

    def _try_close(self, target: int, size: int, closer: str, *more: Any) -> None:
        self._closer.try_close(target, size, closer, *more)  # joined, expected

    # -- memberships --

    def read_membership(self, generation: int) -> Membership:
        return read_membership(self._store, self._keys, generation)

    def _raise_if_finished(self, generation: int, size: int | None = None) -> None:
        """A node that comes back (stopped, fenced, late) after every member of the last
        generation passed its exit barrier finds the job over: nobody will close its round.
        size: the generation's, when known (its membership is not read again)."""
        if generation < 0:
            return
        if size is None:
            membership = self.closed_membership(generation)
            if membership is None:
                return
            size = len(membership.members)
        # Nodes lost at the exit barrier (their lease expired after the others finished:
        # agent/ending.py) are not waited for, and never exit it. A node passed the
        # barrier only once every node not lost had finished: one exit is the proof.
        exited = self._ends.exited_count(generation)
        if exited > 0 and exited + len(self._ledger.lost_nodes(generation, size)) >= size:
            raise JobFinished(
                f"the job finished at generation {generation} with "
                f"{size} nodes while this node was away; nothing to rejoin"
            )

    def closed_membership(self, generation: int) -> Membership | None:
        """The membership of `generation` if its round has closed, without waiting."""
        if not self._store.exists(self._keys.closed(generation)):
            return None
        return self.read_membership(generation)
