"""GenerationMonitor: what a node watches while its generation runs, until it ends.

Its workers every --monitor-interval (exits, heartbeats, stopped processes), its GPUs,
and the store only every STORE_CHECK_S (or at once when a worker failed: was the node
fenced first?): its peers' leases, the round, the abort record, nodes waiting to join.
It observes and says how the generation ended (Ended); what follows is core's decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.clock import Clock
from ..core.config.component_specs import MonitorPart
from ..core.rendezvous.decisions import Outcome
from .faults import FaultPolicy, kill_hung
from .generation import Generation
from .health.guard import HealthGuard
from .net.descriptors import raise_if_ran_out_in_thread
from .observe.observer import Observer
from .observe.stragglers import PaceWatch
from .rendezvous.generation_watch import GenerationWatch
from .rendezvous.job import JobRendezvous
from .rendezvous.lease import Leases
from .snapshots.service import SnapshotService
from .state import Ended
from .waiting import SYSTEM_CLOCK
from .workers.process_tree import ZombieReaper

logger = logging.getLogger(__name__)

# A running generation looks at the store at most this often (and heartbeat_interval/2):
# its peers' leases, and its news (rendezvous/generation_watch.py), so that an agent's
# store traffic is a few requests a second whatever --monitor-interval is.
STORE_CHECK_S = 0.25


class GenerationMonitor:
    def __init__(
        self,
        part: MonitorPart,
        check_signal: Callable[[], None],
        snapshots: SnapshotService,
        observer: Observer,
        policy: FaultPolicy,
        leases: Leases,
        health: HealthGuard | None,
        reaper: ZombieReaper | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._part = part
        self._check_signal = check_signal
        self._snapshots = snapshots
        self._observer = observer
        self._policy = policy
        self._leases = leases
        self._health = health
        self._reaper = reaper
        self._clock = clock

    def lease_lapsed(self, generation: int) -> bool:
        """etcd expired this node's lease in this generation: the others went on without it."""
        return self._leases.lapsed() == generation

    def pace_watch(self, rdzv: JobRendezvous, gen: Generation) -> PaceWatch:
        """Slow ranks, found and worked around (agent/observe/stragglers.py)."""
        group = gen.group
        return PaceWatch(
            rdzv.store,
            rdzv.keys,
            gen.number,
            gen.node_rank,
            gen.num_nodes,
            gen.hangs.beat_dir,
            lambda: [(w.local_rank, w.rank) for w in group.workers],
            gen.worker_store,
            self._clock,
            self._part.stragglers,
            replace_after_s=self._part.replace_stragglers_after,
        )

    def watch(self, rdzv: JobRendezvous, gen: Generation) -> Ended:
        """Until the generation ends on this node; how it ended."""
        pace = self.pace_watch(rdzv, gen)
        try:
            return self._watch(rdzv, gen, pace)
        finally:  # generation_end's snapshot_s: the pace files read once, as it ends
            self._observer.snapshots_took(pace.snapshot_s())

    def _watch(self, rdzv: JobRendezvous, gen: Generation, pace: PaceWatch) -> Ended:
        group, generation = gen.group, gen.number
        room_to_grow = len(gen.membership.members) < self._part.max_nodes
        watch = GenerationWatch(rdzv.rounds, rdzv.ends, generation, room_to_grow, self._clock)
        store_every = min(STORE_CHECK_S, self._part.heartbeat_interval / 2)
        next_store_check = 0.0
        while True:
            self._check_signal()
            raise_if_ran_out_in_thread()  # the agent's _generations restarts this part
            group.poll(self._part.monitor_interval)
            # A signal for the whole step (Slurm's) reaches the workers too: act on it
            # before their deaths look like a failure.
            self._check_signal()
            now = self._clock.now()
            store_due = now >= next_store_check
            if store_due:
                next_store_check = now + store_every
                progress = self._snapshots.progress()
                beats = gen.beats()
                # the adapt policy's job-wide interval, ahead of where the workers are
                self._snapshots.agree_interval([beat[1] for _, beat in beats if beat])
                self._observer.sample(beats, *progress)
                seam = group.handover
                through = None if seam is None else seam.observe(group.workers)
                self._observer.publish_status(
                    rdzv.store, rdzv.keys, gen.place, beats, *progress, through
                )
                pace.check()
            look = False  # at the round, the abort record and the waiting nodes
            if store_due or group.failed:
                self._leases.raise_if_store_lost()
                look = watch.due(force=bool(group.failed))
                if (look and watch.fenced()) or self.lease_lapsed(generation):
                    self._policy.log_fenced(gen)
                    return Ended(Outcome.MEMBERSHIP_CHANGE)
            hung = gen.hangs.hung({w.local_rank: w.pid for w in group.running})
            if hung:
                kill_hung(group, gen.hangs, hung)
            if group.failed:
                return Ended(Outcome.LOCAL_FAILURE)
            fault = self._health.poll() if self._health is not None else None
            if fault is not None:
                return Ended(Outcome.GPU_FAULT, fault)
            slow = pace.lasting() if store_due else None
            if slow is not None:
                return Ended(Outcome.SLOW_NODE, slow)
            if group.succeeded:
                return Ended(Outcome.SUCCEEDED)
            if self._reaper is not None:
                self._reaper.poll()
            if not store_due:
                continue
            if self._policy.check_peers(gen):
                return Ended(Outcome.MEMBERSHIP_CHANGE)
            if look and watch.admits_waiting():
                logger.info("a new node is waiting to join; restarting to admit it")
                return Ended(Outcome.MEMBERSHIP_CHANGE)
