"""Train through a fault: the kept workers go on at once, a replacement joins when warm.

Under rtrain.repairable(train_through=True), a generation that follows a repair in place
names the ranks whose processes were kept (RTRAIN_KEPT_RANKS, every member's, from the
agents: agent/rendezvous/kept_ranks.py). Then:

- a kept worker opens a group of the kept ranks alone (on the generation's store, under
  a prefix of its own) and trains on at once: the missing ranks' data shares are done
  by kept peers (core/worker/shares.py, core/repair/shares.py), so the global batch is
  kept. At each step boundary (rtrain.data_ranks()) the kept ranks agree, by one small
  all-reduce, whether every new rank has said it is ready; when they have, each leaves
  the function with Regroup (its newest snapshot committed at the step before);
- a new worker runs the script's start-up (imports, module level, model construction)
  while they train, says it is ready on entering the function, and opens the
  generation's whole group, where the kept ones meet it at that boundary;
- in the whole group the first kept rank sends its newest snapshot to each new one
  (hand_over_state), which adopts it as its own, and the function is called again on
  every rank: each restores that same step, and the job is at full size.

A fault during the interim is a repair like any other: the agent asks the kept workers
to park (the interim group is released as the whole one would be).
"""

from __future__ import annotations

import datetime
import enum
import os
import time
from typing import Any

from ...clock import wait_until
from ...contract.environment import DATA_WORLD, KEPT_RANKS, SNAPSHOT_BUDGET, decode_ranks
from ...contract.train_through import finished_key, interim_prefix, ready_key, regroup_key
from ...repair.shares import assign_shares
from ...snapshots.format import SnapshotError
from .. import shares
from ..snapshot_handover import adopt_shard, newest_shard, newest_step
from .group import TrainingGroup

STORE_TIMEOUT_S = 300.0
POLL_S = 0.01


class Regroup(BaseException):
    """Every new rank is warm: the kept ranks leave the interim group at this step
    boundary (a BaseException, so a script's `except Exception` does not keep it)."""


class TrainThroughError(RuntimeError):
    """This process cannot take the part the agents' kept ranks give it."""


class Role(enum.Enum):
    KEPT = "kept"  # trains on in the interim group, then meets the new ranks
    NEW = "new"  # warms up, says so, and joins the whole group


def role(train_through: bool, repaired: bool) -> Role | None:
    """This worker's part in its generation; None: the generation's whole group at once
    (no train-through asked, the first generation, every rank kept, or a full restart)."""
    if not train_through or KEPT_RANKS not in os.environ:
        return None
    if DATA_WORLD not in os.environ:  # the agents set it for a data-parallel job alone
        return None  # --tp or --pp above 1: repaired in place, waiting for the new ranks
    kept = decode_ranks(os.environ.get(KEPT_RANKS))
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if not kept or len(kept) >= world:
        return None
    rank = int(os.environ.get("RANK", "0") or 0)
    if rank not in kept:
        return Role.NEW
    if not repaired:
        raise TrainThroughError(f"rank {rank} is named kept, but this process is a new one")
    return Role.KEPT


def kept_ranks() -> tuple[int, ...]:
    return decode_ranks(os.environ.get(KEPT_RANKS)) or ()


def worker_store() -> Any:
    """A client of the generation's store (MASTER_ADDR:MASTER_PORT, hosted by node 0)."""
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
        wait_for_workers=False,
    )


def say_ready(generation: int, timeout_s: float) -> bool:
    """A new worker, at the function's entry: its start-up is done. True once the kept
    ranks come to the whole group; False if they finished the training first (this
    worker then ends with the job). TrainThroughError if neither within timeout_s."""
    store = worker_store()
    store.set(ready_key(generation, int(os.environ["RANK"])), b"1")
    keys = [regroup_key(generation)], [finished_key(generation)]
    found: list[bool] = []

    def answered() -> bool:
        for joins, key in ((True, keys[0]), (False, keys[1])):
            if store.check(key):
                found.append(joins)
                return True
        return False

    if not wait_until(answered, timeout_s, POLL_S, time.monotonic, time.sleep):
        raise TrainThroughError(f"the kept ranks did not come within {timeout_s:g}s")
    return found[0]


class Interim:
    """The kept ranks' group while the new ones warm up, and their shares."""

    def __init__(self, backend: str | None, timeout_s: float | None, generation: int) -> None:
        import torch.distributed as dist

        self.kept = kept_ranks()
        self._generation = generation
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        self.joiners = [r for r in range(world) if r not in self.kept]
        self._keys = [ready_key(generation, r) for r in self.joiners]
        self._store = worker_store()
        prefixed = dist.PrefixStore(interim_prefix(generation), self._store)
        members = (prefixed, self.kept.index(rank), len(self.kept))
        self.group = TrainingGroup(backend, timeout_s, members)
        logical = shares.data_world()
        held = assign_shares(logical, self.kept)
        shares.enter(shares.Shares(logical, rank, held, self._boundary))

    def _boundary(self) -> None:
        """Regroup once every kept rank has seen every new one ready."""
        import torch
        import torch.distributed as dist

        seen = torch.tensor([1 if self._store.check(self._keys) else 0])
        dist.all_reduce(seen, op=dist.ReduceOp.MIN)
        if int(seen.item()):
            self._store.set(regroup_key(self._generation), b"1")
            raise Regroup()

    def finish(self) -> None:
        """The function returned in the interim: the new ranks have nothing to join."""
        self._store.set(finished_key(self._generation), b"1")

    def close(self) -> None:
        shares.leave()
        self.group.close()


def hand_over_state() -> int:
    """In the whole group, every rank: the first kept rank sends its newest snapshot to
    each new rank, which adopts it; the step every rank restores next (-1: none yet).
    The kept ranks must hold the same newest step (they trained in step)."""
    import torch
    import torch.distributed as dist

    kept = kept_ranks()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([newest_step() if rank in kept else -1], dtype=torch.int64)
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(steps, mine)
    held = {int(steps[r].item()) for r in kept}
    if len(held) != 1:
        raise TrainThroughError(f"the kept ranks hold different newest steps: {sorted(held)}")
    (step,) = held
    if step < 0:
        return step  # nothing committed yet: every rank starts the function afresh
    source = kept[0]
    joiners = [r for r in range(world) if r not in kept]
    if rank == source:
        found = newest_shard()
        assert found is not None
        data = torch.frombuffer(bytearray(found[1]), dtype=torch.uint8)
        for joiner in joiners:
            dist.send(torch.tensor([data.numel()], dtype=torch.int64), joiner)
            dist.send(data, joiner)
    elif rank in joiners:
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, source)
        limit = int(os.environ.get(SNAPSHOT_BUDGET, "0") or 0)
        if size.item() <= 0 or (limit and size.item() > limit):
            raise SnapshotError(f"refusing a handed-over snapshot of {int(size.item())} bytes")
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, source)
        try:
            adopted = adopt_shard(bytearray(data.numpy().tobytes()))
        except SnapshotError as exc:
            if "DTensor" not in str(exc):
                raise
            raise TrainThroughError(
                "train_through=True needs every kept rank to hold the same state (DDP's "
                "replicas); this snapshot holds sharded DTensors (FSDP2): leave "
                "train_through off for such a job"
            ) from None
        if adopted != step:
            raise SnapshotError("the handed-over snapshot is not of the kept ranks' step")
    return step
