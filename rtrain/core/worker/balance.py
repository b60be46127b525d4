"""Balancing: a slow rank holds fewer logical data ranks and its peers more, the global
batch kept (issue 49). Under RTRAIN_STRAGGLERS=balance node 0's agent writes a
versioned plan (each slow rank's relative speed) to the generation's worker store
(core/contract/pace.py); every RTRAIN_BALANCE_EVERY data_ranks() calls each rank reads
the newest version's number and the ranks agree with one one-element all_reduce(MIN)
over what each read, so that all switch to the plan at the same step, once every rank
has it. The shares are core/repair/shares.balance_shares of the plan: the averages
stay in logical order, and the result bitwise that of the run without balancing.

A new process group (a new generation, a repair, a train-through's interim or its
end) starts again from the plan-less shares on every rank alike: the call count and
the plan are reset on each rank as it meets the group.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from ..contract.environment import HEARTBEAT_FILE
from ..contract.pace import (
    BALANCE_EVERY,
    DEFAULT_BALANCE_EVERY,
    PLAN_LATEST,
    STRAGGLERS,
    Plan,
    micro_batches,
    mode,
    plan_key,
)
from ..repair.shares import balance_shares

STORE_TIMEOUT_S = 60.0


class Balance:
    def __init__(self) -> None:
        self.calls = 0
        self.group: tuple[Any, ...] | None = None
        self.plan: Plan | None = None
        self.held: dict[int, tuple[int, ...]] | None = None
        self._store: Any = None
        self._store_for: tuple[str, str] | None = None
        self._seen = False  # PLAN_LATEST was found in this store

    def reset(self) -> None:
        self.group, self.calls, self.plan, self.held = None, 0, None, None

    @staticmethod
    def on() -> bool:
        """Under rtrain's agent (its heartbeat file) and asked for; read at each call: a
        forked worker gets its variables after its import."""
        env = os.environ
        return (
            mode(env.get(STRAGGLERS)) == "balance"
            and HEARTBEAT_FILE in env
            and "MASTER_ADDR" in env
        )

    @staticmethod
    def every() -> int:
        value = os.environ.get(BALANCE_EVERY)
        return micro_batches(value) if value else DEFAULT_BALANCE_EVERY

    def boundary(self, logical: int, world: int) -> None:
        """At data_ranks() of a whole group: count the call, and every `every` calls
        agree on a plan with the other ranks."""
        group = _group_now()
        if group != self.group:  # a new group: every rank starts again without a plan
            self.reset()
            self.group = group
        self.calls += 1
        if self.calls % self.every():
            return
        import torch
        import torch.distributed as dist

        seen = torch.tensor([self._latest()], dtype=torch.int64)
        if dist.is_available() and dist.is_initialized() and world > 1:
            dist.all_reduce(seen, op=dist.ReduceOp.MIN)
        agreed = int(seen.item())
        if agreed < 1 or (self.plan is not None and self.plan.version == agreed):
            return
        plan = self._read(agreed)
        if plan is None:  # not rtrain's: every rank refuses it alike
            return
        self.plan = plan
        self.held = balance_shares(logical, range(world), plan.speeds)

    def _client(self) -> Any:
        where = (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
        if self._store is None or self._store_for != where:
            import torch.distributed as dist

            self._store = dist.TCPStore(
                where[0],
                int(where[1]),
                is_master=False,
                timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
            self._store_for, self._seen = where, False
        return self._store

    def _latest(self) -> int:
        """The newest plan's version this rank can read now (0: none)."""
        try:
            store = self._client()
            if not self._seen and not store.check([PLAN_LATEST]):
                return 0
            self._seen = True  # never deleted: from now on one request, not two
            text = bytes(store.get(PLAN_LATEST)).decode()
        except (RuntimeError, ValueError, OSError):
            return 0
        return int(text) if text.isdigit() else 0

    def _read(self, version: int) -> Plan | None:
        """Plan `version`: written once, before its number was."""
        # not caught: a rank that cannot read what the others do must not go on alone
        return Plan.decode(bytes(self._client().get(plan_key(version))))


def _group_now() -> tuple[Any, ...]:
    """What names the process group a whole-group step runs in."""
    import torch.distributed as dist

    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    keys = ("RTRAIN_GENERATION", "RANK", "WORLD_SIZE", "MASTER_PORT")
    return (id(world), *(os.environ.get(k, "") for k in keys))


BALANCE = Balance()
