"""The weight gradients of one stage, summed over every micro-batch of every replica,
whichever worker ran each: what the ReCycle paper asks of gradient reduction (each
replica weighted by the micro-batches it processed, not by its workers).

Two ways, chosen per schedule:

- "exact": the stage's workers gather every micro-batch's gradient and each adds them
  up in one fixed order: per replica over its micro-batches (as a pipeline schedule
  accumulates .grad), scaled by 1/n_microbatches (torch's scale_grads), divided by
  the replicas (as DDP divides before its all-reduce), the replicas in order. Who ran
  what changes nothing, so a run that lost a worker ends with bitwise the weights of
  one that did not. The price: a flat gradient kept per micro-batch this worker ran,
  and a gather of all of them within the stage.
- "sum": each worker adds its own micro-batches' gradients and the stage all-reduces
  the sums: one gradient of memory and one all-reduce, but the order of the floating
  point sum depends on who ran what.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

REDUCTIONS = ("exact", "sum")
Key = tuple[int, int]  # (replica, micro-batch)


def flatten(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def unflatten_into(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> None:
    """Set each parameter's .grad to its piece of `flat`."""
    offset = 0
    for param in params:
        piece = flat[offset : offset + param.numel()].view_as(param)
        param.grad = piece.clone() if param.grad is None else param.grad.copy_(piece)
        offset += param.numel()


def exact_total(
    mine: dict[Key, torch.Tensor],
    group: dist.ProcessGroup | None,
    replicas: int,
    microbatches: int,
    scale: bool,
) -> torch.Tensor:
    """The stage's gradient from every worker's per-micro-batch gradients (see above)."""
    gathered = dict(mine)
    if group is not None and dist.get_world_size(group) > 1:
        gathered = _gather(mine, group, replicas, microbatches)
    expected = {(r, m) for r in range(replicas) for m in range(microbatches)}
    if set(gathered) != expected:
        missing = sorted(expected - set(gathered))
        raise RuntimeError(f"the stage's gradients lack micro-batches {missing[:8]}")
    total: torch.Tensor | None = None
    for replica in range(replicas):
        acc = gathered[(replica, 0)].clone()
        for m in range(1, microbatches):
            acc += gathered[(replica, m)]
        if scale and microbatches > 1:
            acc.div_(microbatches)
        if replicas > 1:
            acc.div_(replicas)
        total = acc if total is None else total.add_(acc)
    assert total is not None
    return total


def sum_total(
    mine: torch.Tensor,
    group: dist.ProcessGroup | None,
    replicas: int,
    microbatches: int,
    scale: bool,
) -> torch.Tensor:
    """The stage's gradient from each worker's sum over its own micro-batches."""
    total = mine.clone()
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    divisor = replicas * (microbatches if scale else 1)
    return total.div_(divisor) if divisor > 1 else total


def _gather(
    mine: dict[Key, torch.Tensor], group: dist.ProcessGroup, replicas: int, microbatches: int
) -> dict[Key, torch.Tensor]:
    """Every worker's (key -> flat gradient), by two all-gathers of padded tensors."""
    size = dist.get_world_size(group)
    numel = next(iter(mine.values())).numel() if mine else 0
    shape = torch.tensor([len(mine), numel], dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(size)]
    dist.all_gather(shapes, shape, group=group)
    rows = max(int(s[0]) for s in shapes)
    widths = {int(s[1]) for s in shapes if int(s[0])}
    if len(widths) > 1:
        raise RuntimeError(f"the stage's workers hold gradients of different sizes: {widths}")
    width = widths.pop() if widths else numel
    keys = torch.full((rows,), -1, dtype=torch.int64)
    dtype = next(iter(mine.values())).dtype if mine else torch.float32
    data = torch.zeros(rows, width, dtype=dtype)
    for i, (key, flat) in enumerate(sorted(mine.items())):
        keys[i] = key[0] * microbatches + key[1]
        data[i] = flat
    all_keys = [torch.empty_like(keys) for _ in range(size)]
    all_data = [torch.empty_like(data) for _ in range(size)]
    dist.all_gather(all_keys, keys, group=group)
    dist.all_gather(all_data, data, group=group)
    found: dict[Key, torch.Tensor] = {}
    for their_keys, their_data in zip(all_keys, all_data, strict=True):
        for i, code in enumerate(their_keys.tolist()):
            if code < 0:
                continue
            key = divmod(int(code), microbatches)
            if key in found or not 0 <= key[0] < replicas:
                raise RuntimeError(f"micro-batch {key} of the stage ran twice or off the grid")
            found[key] = their_data[i]
    return found
