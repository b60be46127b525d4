"""Train a small MLP with DistributedDataParallel over gloo on the CPU.

    rtrain launch --standalone --nproc-per-node=2 examples/train_mlp.py --steps 200

Deterministic: the same seed, world size and step count give the same final weights,
whichever launcher runs it (the final line prints a checksum of the parameters).
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def batch(
    step: int, rank: int, size: int, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's shard of step `step`: a fixed function of (step, rank), so runs repeat."""
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    inputs = torch.randn(size, weights.shape[0], generator=generator)
    targets = inputs @ weights + 0.01 * torch.randn(size, 1, generator=generator)
    return inputs, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    true_weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(42))

    for step in range(args.steps):
        inputs, targets = batch(step, rank, args.batch_size, true_weights)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)

    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(
            f"done: {args.steps} steps on {world} workers "
            f"(generation {os.environ.get('RTRAIN_GENERATION', '-')}), "
            f"parameter checksum {checksum:.6f}",
            flush=True,
        )
    # Free DDP's reducer first: if it held the last reference to the process group, its
    # destructor would join gloo's threads while holding the GIL, and a thread finishing
    # the last all-reduce needs the GIL (torch 2.13 hangs at exit about 1 run in 15).
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
