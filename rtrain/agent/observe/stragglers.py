"""Slow ranks, found and worked around (issue 49; docs/stragglers.md): what an agent
does for them while its generation runs (GenerationMonitor calls check() at each of
its store checks).

Every PUBLISH_S each agent reads its workers' pace files (core/contract/pace.py: two
pread calls a worker) and publishes their cumulative figures under r<g>/pace/<node>
(nothing, and no store traffic, for a script that does not measure: no pace file).
Node 0's agent reads every node's record in one multi_get, cuts windows from them and
judges them (core/pace/: pure), and publishes its verdict, the stragglers now, under
r<g>/stragglers when it changes; under --stragglers=balance it also writes a new
balancing plan to the generation's worker store, which it hosts, for the workers to
switch to together (core/worker/balance.py). Every agent reads the verdict and writes
a `straggler` event for each of its own ranks found (with its GPU's clocks, where
NVML has them) and a `straggler_cleared` event when one recovers. An agent's store
traffic: one write and one read a PUBLISH_S (node 0: one multi_get more).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.clock import Clock
from ...core.contract.pace import (
    PACE_SIZE,
    PLAN_LATEST,
    Pace,
    Plan,
    mode,
    pace_path,
    plan_key,
    unpack_pace,
)
from ...core.errors import StoreUnavailable
from ...core.pace.detect import Detector, Rule, Straggler, decode_verdict, encode_verdict
from ...core.pace.figures import Windows, decode_node, encode_node
from ...core.rendezvous.failures import FailureKind
from ...core.rendezvous.protocol import ProtocolError, StoreKeys
from ..health.gpu_clocks import gpu_clocks
from ..store.kv import KeyValueStore
from .events import emit

logger = logging.getLogger(__name__)

PUBLISH_S = 1.0
# A straggler's speed that moved by more than this part of the planned one: a new plan.
REPLAN_BY = 0.2
# (local rank, global rank) of each worker the node runs now
Workers = Callable[[], Sequence[tuple[int, int]]]


class PaceWatch:
    def __init__(
        self,
        store: KeyValueStore,
        keys: StoreKeys,
        generation: int,
        node_rank: int,
        num_nodes: int,
        beat_dir: str,
        workers: Workers,
        worker_store: Any,
        clock: Clock,
        mode_name: str = "detect",
        rule: Rule | None = None,
        replace_after_s: float = 0.0,
    ) -> None:
        """replace_after_s: --replace-stragglers-after (0: never), see lasting()."""
        self._replace_after_s = replace_after_s
        self._store, self._keys = store, keys
        self._generation, self._node, self._nodes = generation, node_rank, num_nodes
        self._beat_dir = beat_dir
        self._workers = workers
        self._worker_store = worker_store  # node 0's: the TCPStore it hosts
        self._clock = clock
        self.mode = mode(mode_name)  # --stragglers
        self._due = 0.0
        self._windows = Windows()
        self._detector = Detector(rule)
        self._said: dict[int, Straggler] = {}  # this node's ranks its events named slow
        self._verdict: bytes | None = None  # the last verdict read
        self._planned: dict[int, float] = {}  # the last plan's speeds
        self._version = 0

    def check(self) -> None:
        """At a store check: publish, judge (node 0), and say, every PUBLISH_S."""
        now = self._clock.now()
        if self.mode == "off" or now < self._due:
            return
        self._due = now + PUBLISH_S
        figures = {r: p for r, p in self.local_figures().items() if p.steps}
        if not figures:  # a script that does not measure (no data_ranks()): no traffic
            return
        try:
            record = encode_node(self._clock.wall(), figures)
            self._store.set(self._keys.pace(self._generation, self._node), record)
            if self._node == 0:
                self._judge()
            self._say()
        except StoreUnavailable:  # the lease watch reports a lost store
            return

    def local_figures(self) -> dict[int, Pace]:
        found = {}
        for local, rank in self._workers():
            path = pace_path(os.path.join(self._beat_dir, f"rank{local}.beat"))
            pace = _read_pace(path)
            if pace is not None:
                found[rank] = pace
        return found

    def _judge(self) -> None:
        keys = [self._keys.pace(self._generation, n) for n in range(self._nodes)]
        merged: dict[int, Pace] = {}
        for payload in self._store.multi_get(keys):
            if payload is not None:
                with contextlib.suppress(ProtocolError):
                    merged.update(decode_node(payload))
        window = self._windows.feed(self._clock.wall(), merged)
        if window is None:
            return
        verdict = self._detector.observe(window)
        if verdict.found or verdict.cleared:
            logger.info(
                "stragglers now: %s", {r: s.slower for r, s in sorted(verdict.current.items())}
            )
            self._store.set(
                self._keys.stragglers(self._generation), encode_verdict(verdict.current)
            )
        if self.mode == "balance" and self._replan(verdict.current):
            self._plan(verdict.current)

    def _replan(self, current: Mapping[int, Straggler]) -> bool:
        """Whether the stragglers changed, or one's speed by more than REPLAN_BY."""
        if set(current) != set(self._planned):
            return True
        return any(
            abs(one.speed() / self._planned[r] - 1.0) > REPLAN_BY for r, one in current.items()
        )

    def _plan(self, current: Mapping[int, Straggler]) -> None:
        """A new plan in the worker store: its body first, then its number."""
        if self._worker_store is None:
            return
        self._version += 1
        plan = Plan(self._version, {r: s.speed() for r, s in current.items()})
        try:
            self._worker_store.set(plan_key(plan.version), plan.encode())
            self._worker_store.set(PLAN_LATEST, str(plan.version))
        except (RuntimeError, OSError) as exc:
            logger.warning("could not write the balancing plan: %s", exc)
            return
        self._planned = dict(plan.speeds)
        logger.info("balancing plan %d: speeds %s", plan.version, dict(plan.speeds))

    def _say(self) -> None:
        payload = self._store.get(self._keys.stragglers(self._generation))
        if payload is None or payload == self._verdict:
            return
        try:
            current = decode_verdict(payload)
        except ProtocolError as exc:
            logger.warning("refusing the straggler verdict: %s", exc)
            return
        self._verdict = payload
        mine = dict(self._workers())
        local_of = {rank: local for local, rank in mine.items()}
        for rank, one in sorted(current.items()):
            if rank in local_of and rank not in self._said:
                self._said[rank] = one
                emit_straggler(one, local_of[rank], self._figures_held(rank))
        for rank in [r for r in self._said if r not in current]:
            since = self._said.pop(rank).since
            emit("straggler_cleared", rank=rank, slow_s=round(self._clock.wall() - since, 3))

    def snapshot_s(self) -> float:
        """The seconds this node's slowest-to-snapshot worker spent in rtrain.snapshot()
        this generation (the steps of all waited for it): badput's snapshot_overhead."""
        return max((p.snapshot_s for p in self.local_figures().values()), default=0.0)

    def lasting(self) -> SlowNode | None:
        """A rank of this node that has been a straggler for --replace-stragglers-after
        (since its first slow window): the node leaves the job, as for a GPU fault, and a
        standby takes its place (None: none, or the policy is off)."""
        if self._replace_after_s <= 0:
            return None
        now = self._clock.wall()
        for rank, one in sorted(self._said.items()):
            if now - one.since >= self._replace_after_s:
                return SlowNode(rank, one.slower, now - one.since)
        return None

    def _figures_held(self, rank: int) -> float | None:
        pace = self.local_figures().get(rank)
        return None if pace is None or not pace.steps else round(pace.logical / pace.steps, 3)


@dataclass(frozen=True)
class SlowNode:
    """A fault of this node's own (agent/state.py's NodeFault): one of its ranks stayed a
    straggler for --replace-stragglers-after; the node leaves the job."""

    rank: int
    slower: float
    slow_s: float

    @property
    def excludes_node(self) -> bool:
        return True

    @property
    def failure_kind(self) -> FailureKind:
        return FailureKind.SLOW_NODE

    def describe(self) -> str:
        return (
            f"rank {self.rank} was {self.slower:.2f}x slower than its peers for "
            f"{self.slow_s:.0f}s (--replace-stragglers-after): a standby takes its place"
        )


def emit_straggler(one: Straggler, local_rank: int, held: float | None) -> None:
    emit(
        "straggler",
        rank=one.rank,
        slower=one.slower,
        since=one.since,
        compute_s=one.compute_s,
        peers_compute_s=one.peers_s,
        wait_s=one.wait_s,
        peers_wait_s=one.peers_wait_s,
        logical=held,
        local_rank=local_rank,
        gpu=gpu_clocks(local_rank),
    )


def _read_pace(path: str) -> Pace | None:
    """A pace file's figures: a read, then its sequence number again (a write that began
    in between makes them differ); None without a consistent reading."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        for _ in range(3):
            found = unpack_pace(os.pread(fd, PACE_SIZE, 0))
            again = os.pread(fd, 8, 0)
            if found is not None and int.from_bytes(again, "little") == found[0]:
                return found[1]
        return None
    except OSError:
        return None
    finally:
        os.close(fd)
