"""data_ranks(), data_world_size() and average_gradients(): a data-parallel script's data
shares, which rtrain may reroute (ReCycle's rerouting, for data parallelism).

A job has as many logical data ranks as the world it was launched with; logical rank
r's share of step s's data is the same whichever process does it. Normally each worker
holds one, its own rank. While a failed rank's replacement starts up under
rtrain.repairable(train_through=True), the kept workers train on at once and its share
is done by a peer (core/repair/shares.py assigns them), so the step's global batch and
sample order stay those of a run without the fault:

    for step in range(start, steps):
        grads = {}
        for logical in rtrain.data_ranks():      # once per step: a step boundary
            model.zero_grad()
            loss_of(batch(step, logical)).backward()
            grads[logical] = [p.grad.clone() for p in model.parameters()]
        rtrain.average_gradients(model.parameters(), grads)
        optimizer.step()

average_gradients sums every logical rank's gradient in logical order and divides by
their number: the same additions in the same order however the shares are spread, so a
run with a fault ends bitwise equal to one without. Without rtrain (torchrun, plain
python) data_ranks() is (RANK,) and the same script runs unchanged. A job that goes on
smaller (a node lost without a standby) keeps its logical ranks too: RTRAIN_DATA_WORLD
is its full size, and each worker of the smaller world holds more of them.

Slow ranks (issue 49, docs/stragglers.md): RTRAIN_MICRO_BATCHES=M gives each worker M
logical ranks (r, r+W, ...; under torchrun too); each step's compute per logical rank and
its wait in the collective are measured here (core/worker/pace.py), and under
RTRAIN_STRAGGLERS=balance the ranks switch together to a plan that gives a slow rank
fewer logical ranks (core/worker/balance.py, at data_ranks()).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.environment import DATA_WORLD
from ..contract.pace import MICRO_BATCHES, micro_batches
from ..repair.shares import assign_shares, holder_of
from . import pace
from .balance import BALANCE

__all__ = ["average_gradients", "data_ranks", "data_world_size"]


@dataclass(frozen=True)
class Shares:
    """The shares of the workers present now."""

    world: int  # logical ranks: the world the job was launched with
    rank: int  # this worker's rank in the generation (RANK)
    held: dict[int, tuple[int, ...]]  # present rank -> its logical ranks
    # Run at each step boundary (data_ranks()): it raises when the group changes there.
    boundary: Callable[[], None] | None = None


class _Active:
    shares: Shares | None = None


def enter(shares: Shares) -> None:
    """From now on the workers present and their shares are these (core/worker/repair/
    through.py, while a replacement warms up)."""
    _Active.shares = shares


def leave() -> None:
    _Active.shares = None


def data_world() -> int:
    """The job's logical data ranks: RTRAIN_DATA_WORLD under rtrain (its full size),
    else the world's size; times RTRAIN_MICRO_BATCHES (core/contract/pace.py)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    size = max(int(os.environ.get(DATA_WORLD, "") or world), world)
    return size * micro_batches(os.environ.get(MICRO_BATCHES))


def current() -> Shares:
    if _Active.shares is not None:
        return _Active.shares
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    if BALANCE.held is not None:  # a balancing plan the ranks agreed on (balance.py)
        return Shares(data_world(), rank, BALANCE.held)
    return _whole(world, rank, data_world())


@functools.lru_cache(maxsize=4)
def _whole(world: int, rank: int, logical: int) -> Shares:
    """The shares of a whole generation: made once per generation, not every step (a
    dict of every rank at thousands of ranks)."""
    if logical == world:
        return Shares(world, rank, {r: (r,) for r in range(world)})
    # a generation smaller than the job (a node lost, no standby): every rank takes more
    return Shares(logical, rank, assign_shares(logical, range(world)))


def data_ranks() -> tuple[int, ...]:
    """The logical data ranks this worker does in this step, ascending. Call it once at
    the start of every step: it is the step boundary where a warm replacement joins."""
    shares = current()
    if shares.boundary is not None:
        BALANCE.reset()  # the interim's shares; the whole group starts again without a plan
        shares.boundary()
    elif BALANCE.on():
        BALANCE.boundary(shares.world, len(shares.held))
        shares = current()
    held = shares.held[shares.rank]
    pace.begin(len(held))
    return held


def data_world_size() -> int:
    """How many logical data ranks each step has (the job's launched world size)."""
    return current().world


def average_gradients(params: Iterable[Any], grads: Mapping[int, Sequence[Any]]) -> None:
    """Set each parameter's .grad to the mean over every logical rank of the step of that
    rank's gradient, summed in logical order. grads: for each of data_ranks(), the
    gradients of `params`, in their order. A collective over the current process group."""
    import torch
    import torch.distributed as dist

    pace.computed()
    shares = current()
    params = list(params)
    mine = shares.held[shares.rank]
    if sorted(grads) != list(mine):
        raise ValueError(
            f"average_gradients: gradients for logical ranks {sorted(grads)}, but this "
            f"worker holds {list(mine)} (rtrain.data_ranks())"
        )
    if any(len(grads[logical]) != len(params) for logical in mine):
        raise ValueError("average_gradients: one gradient per parameter for each logical rank")
    rows = torch.stack([torch.cat([g.reshape(-1) for g in grads[r]]) for r in mine])
    width = max(len(held) for held in shares.held.values())
    send = torch.zeros(width, rows.shape[1], dtype=rows.dtype)
    send[: len(mine)] = rows
    present = sorted(shares.held)
    began = time.perf_counter()
    if dist.is_available() and dist.is_initialized() and len(present) > 1:
        parts = [torch.empty_like(send) for _ in present]
        dist.all_gather(parts, send)
    else:
        parts = [send]
    pace.waited(time.perf_counter() - began)
    dense = {rank: index for index, rank in enumerate(present)}  # the group's rank of each
    where = holder_of(shares.held)
    total = None
    for logical in range(shares.world):
        holder, index = where[logical]
        row = parts[dense[holder]][index]
        total = row.clone() if total is None else total.add_(row)
    assert total is not None
    total.div_(shares.world)
    offset = 0
    for param in params:
        size = param.numel()
        param.grad = total[offset : offset + size].view_as(param).clone()
        offset += size
