"""A plain DDP + gloo script that saves with torch.distributed.checkpoint and ends
with destroy_process_group(), keeping its model in a global: what users write.

Freeing the DDP model while gloo's threads still need the GIL deadlocks (pytorch#56297);
a launcher that drops the script's globals before the worker leaves makes that happen.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    optimizer.zero_grad()
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(args.out, "ckpt"))
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
