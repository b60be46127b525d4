"""JobRendezvous: one job's view of the rendezvous store, split by job.

store   the typed store (agent/store/kv.py), for the few keys of other subsystems
rounds  rounds, memberships and the worker store's address      (rounds.py)
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
from ...core.rendezvous.protocol import StoreKeys
from ..store.kv import KeyValueStore
from ..waiting import SYSTEM_CLOCK
from .job_end import JobEndRecords
from .ledger import FailureLedger
from .rounds import Rounds

logger = logging.getLogger(__name__)


@dataclass
class JobRendezvous:
    store: KeyValueStore
    keys: StoreKeys
    rounds: Rounds
    ledger: FailureLedger
    ends: JobEndRecords

    @classmethod
    def over(
        cls, store: KeyValueStore, spec: LaunchSpec, clock: Clock = SYSTEM_CLOCK
    ) -> JobRendezvous:
        """The job's rendezvous, each part given its own settings (rendezvous_part); its
        StoreKeys, made here once, are the job's: every other part takes them from here."""
        part = rendezvous_part(spec)
        keys = StoreKeys(part.run_id)
        ledger = FailureLedger(store, keys, part.max_node_failures)
        ends = JobEndRecords(store, keys, clock)
        return cls(store, keys, Rounds(store, keys, part, ledger, ends, clock), ledger, ends)

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
