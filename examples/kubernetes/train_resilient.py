"""Train a small MLP with DistributedDataParallel that survives the loss of a pod.

Each step keeps the model, the optimizer and the step with `rtrain.snapshot()`: the
agent copies it to a peer pod's memory in the background. When a pod is lost (a node
gone, an eviction, a kill), the job goes on in a new generation: the replacement pod's
workers, and the others', start this script again and `rtrain.restore()` hands each
rank the newest step every rank kept, from local memory or a peer's. Nothing is read
from disk.

    rtrain launch --nnodes=2 ... train_resilient.py --backend=nccl   # one GPU a worker
    rtrain launch --standalone --nproc-per-node=2 train_resilient.py --backend=gloo

The data of each step depends on the step and the rank only, so a run that lost a pod
ends with the parameter checksum (the last line) of one that did not, to float rounding
(DDP, made anew after a restore, adds its first step's gradients in another order).
The image of examples/kubernetes/Dockerfile has it as /workspace/train_resilient.py.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import rtrain


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Rank `rank`'s data of step `step`: the same on every run, whatever failed."""
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(42))
    inputs = torch.randn(size, 16, generator=generator)
    targets = inputs @ weights + 0.01 * torch.randn(size, 1, generator=generator)
    return inputs.to(device), targets.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    device = torch.device("cpu")
    if args.backend == "nccl":  # one GPU a worker: --nproc-per-node=gpu
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)

    start = 0
    restored = rtrain.restore()  # None on the first start, or without rtrain
    if restored is not None:
        state, step = restored
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = step + 1
        if rank == 0:
            print(f"restored step {step}; going on from step {start}", flush=True)
    model = DistributedDataParallel(
        net, device_ids=[device.index] if device.index is not None else None
    )

    for step in range(start, args.steps):
        inputs, targets = batch(step, rank, args.batch_size, device)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # Kept in this node's memory and sent to a peer's in the background.
        rtrain.snapshot({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, step)
        rtrain.heartbeat(step)  # a worker silent for --hang-timeout is restarted
        if rank == 0 and (step % 100 == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {loss.item():.5f}", flush=True)

    checksum = sum(p.double().sum().item() for p in net.parameters())
    if rank == 0:
        generation = os.environ.get("RTRAIN_GENERATION", "-")
        print(
            f"done: {args.steps} steps on {world} workers (generation {generation}), "
            f"parameter checksum {checksum:.6f}",
            flush=True,
        )
    # DDP's reducer goes first: holding the last reference to the process group, its
    # destructor would join gloo's threads while holding the GIL.
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
