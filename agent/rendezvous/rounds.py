"""StoreRendezvous: agents agree on each generation's membership through the store.

The protocol (keys, validation, ordering and closing rules) lives in
rtrain.core.rendezvous.protocol; this class only performs it against a live store.
Only non-blocking store calls are used, so the agent stays responsive to signals.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ...core.config.launch_spec import LaunchSpec
from ...core.errors import RendezvousError, RtrainError
from ...core.rendezvous.failures import FailureRecord, RecordError, root_cause_first
from ...core.rendezvous.protocol import (
    AbortRecord,
    MemberInfo,
    Membership,
    ProtocolError,
    StoreKeys,
    decode_int,
    decode_master,
    encode_master,
    members_to_close,
    order_members,
)
from ..store.tcp import StoreCalls, text_of

logger = logging.getLogger(__name__)

POLL_S = 0.02
# A joiner takes its slot number and writes its slot a moment later.
SLOT_WRITE_GRACE_S = 5.0


class GenerationEnded(Exception):
    """The generation this node was starting is already over (a member died or left):
    not an error, the node rejoins at the next round."""


class JobAborted(Exception):
    def __init__(self, record: AbortRecord) -> None:
        super().__init__(record.reason)
        self.record = record


class StoreRendezvous:
    def __init__(
        self,
        store: Any,
        spec: LaunchSpec,
        endpoint: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._s = StoreCalls(store, endpoint, spec.rdzv.read_timeout)
        self._spec = spec
        self._keys = StoreKeys(spec.rdzv.run_id)
        self._endpoint = endpoint
        self._clock = clock

    def _call(self, op: str, *args: Any) -> Any:
        return self._s.call(op, *args)

    # -- generations --

    def current_round(self) -> int:
        # One round trip: creates the counter at "0" if missing, else returns its value.
        try:
            return decode_int(self._call("compare_set", self._keys.round, "", "0"), "round counter")
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's state in the store: {exc}") from None

    def open_next_round(self, generation: int) -> None:
        """Advance the job from `generation` to the next one (idempotent across agents)."""
        self._call("compare_set", self._keys.round, str(generation), str(generation + 1))

    def join(
        self,
        member: MemberInfo,
        check_stop: Callable[[], None] | None = None,
        expected: Callable[[], set[str]] | None = None,
    ) -> Membership:
        """Block until a generation closes with this node in it; raise on timeout or abort.

        expected: the node ids known to be coming (the previous generation's survivors),
        asked on every pass so that a peer found dead meanwhile stops being waited for.
        """
        rdzv = self._spec.rdzv
        deadline = self._clock() + rdzv.join_timeout
        while True:
            current = self.current_round()
            target = current + 1 if self._s.exists(self._keys.closed(current)) else current
            slot = self._s.increment(self._keys.joins(target))
            self._call("set", self._keys.slot(target, slot), member.encode())
            logger.info("joined round %d as slot %d (this node: %s)", target, slot, member.addr)
            membership = self._await_close(target, member, deadline, check_stop, expected)
            if membership is not None:
                return membership
            self.raise_if_excluded(member.addr)
            logger.info("round %d closed without this node; waiting for the next", target)

    def _await_close(
        self,
        target: int,
        member: MemberInfo,
        deadline: float,
        check_stop: Callable[[], None] | None,
        expected: Callable[[], set[str]] | None,
    ) -> Membership | None:
        nodes = self._spec.nodes
        quorum_since: float | None = None
        while True:
            self.raise_if_aborted()
            if check_stop is not None:
                check_stop()
            closed_key = self._keys.closed(target)
            if self._s.exists(closed_key):
                membership = self.read_membership(target)
                if membership.node_rank_of(member.node_id) is None:
                    return None
                return membership
            joined = self._s.counter(self._keys.joins(target))
            if self.current_round() == target:
                now = self._clock()
                if joined >= nodes.min_nodes and quorum_since is None:
                    quorum_since = now
                age = None if quorum_since is None else now - quorum_since
                size = members_to_close(
                    joined,
                    nodes.min_nodes,
                    nodes.max_nodes,
                    age,
                    self._spec.rdzv.last_call_timeout,
                    self._survivors_in(target, joined, expected),
                )
                if size is not None:
                    self._try_close(target, size, member.node_id)
            if self._clock() > deadline:
                raise RendezvousError(
                    f"rendezvous timed out: {joined} of at least {nodes.min_nodes} nodes joined "
                    f"generation {target} within join_timeout={self._spec.rdzv.join_timeout:g}s"
                )
            time.sleep(POLL_S)

    def _survivors_in(
        self, target: int, joined: int, expected: Callable[[], set[str]] | None
    ) -> bool:
        """Whether every expected node has joined; slots are read only once enough have."""
        if expected is None or joined < self._spec.nodes.min_nodes:
            return False
        alive = expected()
        return joined >= len(alive) and alive <= self._joined_ids(target, joined)

    def _joined_ids(self, target: int, joined: int) -> set[str]:
        ids = set()
        for slot in range(1, joined + 1):
            key = self._keys.slot(target, slot)
            # Garbage is refused with a log line when the round closes.
            if self._s.exists(key):
                with contextlib.suppress(ProtocolError):
                    ids.add(MemberInfo.decode(self._call("get", key)).node_id)
        return ids

    def _charge_root_cause(self, target: int, closer: str) -> None:
        """Charge the node at the root of generation target-1's failure, exactly once.

        Every member records its failures before it rejoins, so when the round closes
        the records of everyone in it are there; the earliest one is the culprit (its
        peers failed because of it). Lost nodes were charged by whoever declared them.
        """
        if target == 0:
            return
        try:
            size = len(self.read_membership(target - 1).members)
        except RendezvousError:
            return
        records = [r for r in self.failures(target - 1, size) if r.kind != "lost_node"]
        if not records:
            return
        root = root_cause_first(records)[0]
        token = f"{closer}:{root.host}"
        if text_of(self._call("compare_set", self._keys.charged(target - 1), "", token)) == token:
            count = self.count_node_failure(root.host)
            logger.info("failure of generation %d charged to %s (%d)", target - 1, root.host, count)

    def _try_close(self, target: int, size: int, closer: str) -> None:
        self._charge_root_cause(target, closer)
        members: list[MemberInfo] = []
        grace_end = self._clock() + SLOT_WRITE_GRACE_S
        for slot in range(1, size + 1):
            key = self._keys.slot(target, slot)
            while not self._s.exists(key) and self._clock() < grace_end:
                time.sleep(POLL_S)
            if not self._s.exists(key):
                logger.warning(
                    "slot %d of round %d was never written; leaving it out", slot, target
                )
                continue
            try:
                member = MemberInfo.decode(self._call("get", key))
            except ProtocolError as exc:
                logger.error("refusing slot %d of round %d: %s", slot, target, exc)
                continue
            if self.is_excluded(member.addr):
                logger.warning("leaving out %s: excluded for failing too often", member.addr)
                continue
            members.append(member)
        if len(members) < self._spec.nodes.min_nodes:
            return
        static = self._spec.rdzv.backend == "static"
        try:
            ordered = order_members(members, static=static)
        except ProtocolError as exc:
            raise RendezvousError(f"rendezvous of generation {target} failed: {exc}") from None
        record = Membership(target, ordered).encode()
        self._call("compare_set", self._keys.closed(target), "", record)

    def read_membership(self, generation: int) -> Membership:
        payload = self._call("get", self._keys.closed(generation))
        try:
            return Membership.decode(payload, generation)
        except ProtocolError as exc:
            raise RendezvousError(
                f"refusing the membership of generation {generation} found in the store: {exc}"
            ) from None

    def closed_membership(self, generation: int) -> Membership | None:
        """The membership of `generation` if its round has closed, without waiting."""
        if not self._s.exists(self._keys.closed(generation)):
            return None
        return self.read_membership(generation)

    def claim_restart(self, generation: int) -> bool:
        """True for the first agent to report a failure in this generation.

        A worker failure usually takes its peers on other nodes down with it (their
        collectives lose a partner); only the first reporter is charged the restart.
        """
        return self._s.increment(self._keys.restart_claim(generation)) == 1

    def round_moved_past(self, generation: int) -> bool:
        return self.current_round() > generation

    def waiting_nodes(self, generation: int) -> int:
        """Agents that joined the next round while this generation runs."""
        return self._s.counter(self._keys.joins(generation + 1))

    # -- the workers' store address --

    def publish_master(self, generation: int, host: str, port: int) -> None:
        self._call("set", self._keys.master(generation), encode_master(host, port))

    def wait_master(
        self, generation: int, timeout_s: float, watch: Callable[[], object] | None = None
    ) -> tuple[str, int]:
        key = self._keys.master(generation)
        end = self._clock() + timeout_s
        while not self._s.exists(key):
            self.raise_if_ended(generation, watch)
            if self._clock() > end:
                raise RendezvousError(
                    f"node 0 did not publish the worker store of generation {generation}"
                )
            time.sleep(POLL_S)
        try:
            return decode_master(self._call("get", key))
        except ProtocolError as exc:
            raise RendezvousError(
                f"refusing the worker store address in the store: {exc}"
            ) from None

    def raise_if_ended(self, generation: int, watch: Callable[[], object] | None) -> None:
        """While a generation starts: abort, or GenerationEnded once the round moved on
        (watch, the peers' lease check, moves it when a member died meanwhile)."""
        self.raise_if_aborted()
        if watch is not None:
            watch()
        if self.round_moved_past(generation):
            raise GenerationEnded(f"generation {generation} ended before it started")

    # -- leases and lost nodes --

    def call(self, op: str, *args: Any) -> Any:
        """A store call with the same error handling, for the lease watchers."""
        return self._call(op, *args)

    def mark_lost(self, generation: int, node_rank: int, by_node: int) -> bool:
        """Declare node_rank's lease expired; True for the first agent to declare it."""
        key = self._keys.lost(generation, node_rank)
        current = self._call("compare_set", key, "", str(by_node))
        return text_of(current) == str(by_node)

    def lost_nodes(self, generation: int, num_nodes: int) -> list[int]:
        keys = [self._keys.lost(generation, n) for n in range(num_nodes)]
        return [n for n, key in enumerate(keys) if self._s.exists(key)]

    def count_node_failure(self, addr: str) -> int:
        return self._s.increment(self._keys.node_failures(addr))

    def node_failures(self, addr: str) -> int:
        return self._s.counter(self._keys.node_failures(addr))

    def raise_if_excluded(self, addr: str) -> None:
        if self.is_excluded(addr):
            limit = self._spec.faults.max_node_failures
            raise RtrainError(
                f"this node ({addr}) is excluded from the job: it was lost, or the root cause "
                f"of a failure, {limit} times (--max-node-failures={limit})"
            )

    def is_excluded(self, addr: str) -> bool:
        """A flapping node: charged --max-node-failures failures (0 means never excluded)."""
        limit = self._spec.faults.max_node_failures
        return limit > 0 and self.node_failures(addr) >= limit

    # -- failures, completion, abort --

    def record_failure(self, record: FailureRecord) -> None:
        index = self._s.increment(self._keys.failure_count(record.generation, record.node_rank))
        self._call(
            "set", self._keys.failure(record.generation, record.node_rank, index), record.encode()
        )

    def failures(self, generation: int, num_nodes: int) -> list[FailureRecord]:
        records: list[FailureRecord] = []
        for node in range(num_nodes):
            count = self._s.counter(self._keys.failure_count(generation, node))
            for index in range(1, count + 1):
                key = self._keys.failure(generation, node, index)
                if not self._s.exists(key):
                    continue
                try:
                    records.append(FailureRecord.decode(self._call("get", key)))
                except RecordError as exc:
                    logger.error("refusing a failure record of node %d: %s", node, exc)
        return records

    def history(self, generations: int) -> list[FailureRecord]:
        """Every failure recorded in generations 0 .. generations-1."""
        records: list[FailureRecord] = []
        for generation in range(generations):
            try:
                size = len(self.read_membership(generation).members)
            except RendezvousError as exc:
                logger.error("%s", exc)
                continue
            records.extend(self.failures(generation, size))
        return records

    def mark_done(self, generation: int) -> None:
        self._s.increment(self._keys.done(generation))

    def done_count(self, generation: int) -> int:
        return self._s.counter(self._keys.done(generation))

    def mark_exited(self, generation: int) -> None:
        self._s.increment(self._keys.exited(generation))

    def exited_count(self, generation: int) -> int:
        return self._s.counter(self._keys.exited(generation))

    def ack_abort(self) -> None:
        self._s.increment(self._keys.abort_acks)

    def abort_acks(self) -> int:
        return self._s.counter(self._keys.abort_acks)

    def abort(self, record: AbortRecord) -> bool:
        """Write the abort record unless one exists; True if this call wrote it."""
        payload = record.encode()
        return text_of(self._call("compare_set", self._keys.abort, "", payload)) == payload

    def read_abort(self) -> AbortRecord | None:
        if not self._s.exists(self._keys.abort):
            return None
        payload = self._call("get", self._keys.abort)
        try:
            return AbortRecord.decode(payload)
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's abort key in the store: {exc}") from None

    def raise_if_aborted(self) -> None:
        record = self.read_abort()
        if record is not None:
            raise JobAborted(record)
