"""JobRendezvous: one job's view of the rendezvous store, split by job.

store   the typed store (agent/store/kv.py), for the few keys of other subsystems
rounds  rounds and memberships                                   (rounds.py)
workers the workers' store address of each generation           (worker_store.py)
kept    the ranks of each generation a repair in place kept alive  (kept_ranks.py)
ledger  failure records, restart claims, lost nodes, exclusion    (ledger.py)
ends    the exit barrier's counters and the abort record          (job_end.py)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...core.clock import Clock
from ...core.config.component_specs import rendezvous_part
from ...core.config.launch_spec import LaunchSpec
from ...core.errors import RendezvousError
from ...core.rendezvous.failures import FailureRecord
from ...core.rendezvous.fault_history import HistoryPolicy
from ...core.rendezvous.protocol import StoreKeys
from ..health.fault_history import FaultHistory
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK
from .job_end import JobEndRecords
from .kept_ranks import KeptRanks
from .ledger import FailureLedger
from .rounds import Rounds
from .worker_store import WorkerStoreAddress

logger = logging.getLogger(__name__)


@dataclass
class JobRendezvous:
    store: KeyValueStore
    keys: StoreKeys
    rounds: Rounds
    ledger: FailureLedger
    ends: JobEndRecords
    workers: WorkerStoreAddress
    kept: KeptRanks

    @classmethod
    def over(
        cls, store: KeyValueStore, spec: LaunchSpec, clock: Clock = SYSTEM_CLOCK
    ) -> JobRendezvous:
        """The job's rendezvous, each part given its own settings (rendezvous_part); its
        StoreKeys, made here once, are the job's: every other part takes them from here."""
        part = rendezvous_part(spec)
        keys = StoreKeys(part.run_id)
        policy = HistoryPolicy(part.standby_after_faults, part.fault_window)
        history = FaultHistory(
            store,
            keys.fault_history,
            policy,
            clock,
            part.run_id,
            part.history_dir,
            part.slurm_nodes,
        )
        ledger = FailureLedger(store, keys, part.max_node_failures, history)
        ends = JobEndRecords(store, keys, clock)
        rounds = Rounds(store, keys, part, ledger, ends, clock)
        workers = WorkerStoreAddress(store, keys, rounds, ends, clock)
        kept = KeptRanks(store, keys, workers, clock)
        return cls(store, keys, rounds, ledger, ends, workers, kept)

    def declare_lost(
        self, generation: int, node_rank: int, by_node: int, record: FailureRecord
    ) -> bool:
        """The one place a node is declared lost: its mark in the ledger (the first
        declarer wins, so the loss is recorded and counted once) and its failure record,
        written by the first declarer, and by a node that declares itself lost whatever
        came first (its own finding: a GPU fault that takes it out). True for the first
        declarer, who charges the loss where one is charged (agent/faults.py)."""
        first = self.ledger.mark_lost(generation, node_rank, by_node)
        if first or by_node == node_rank:
            self.ledger.record_failure(record)
        return first

    def leave(self, generation: int, node_rank: int, record: FailureRecord) -> None:
        """This node leaves the job: it declares itself lost, so that the others go on at
        once instead of waiting for its lease to expire, and opens the next round. The
        store may be gone too: leaving must not fail, so that is a log line."""
        try:
            self.declare_lost(generation, node_rank, node_rank, record)
            self.rounds.open_next_round(generation)
        except Exception as exc:
            logger.warning("could not tell the other nodes: %s", exc)

    def history(self, generations: int) -> list[FailureRecord]:
        """Every failure recorded in generations 0 .. generations-1."""
        records: list[FailureRecord] = []
        for generation in range(generations):
            try:
                size = len(self.rounds.read_membership(generation).members)
            except RendezvousError as exc:
                logger.error("%s", exc)
                continue
            records.extend(self.ledger.failures(generation, size))
        return records
