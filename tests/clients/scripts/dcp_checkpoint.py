"""torch.distributed.checkpoint as a training loop uses it: DDP + gloo, dcp.save every
--every steps into <ckpt-dir>/step_<n>, and at start dcp.load of the newest complete one
(a crash then costs at most --every steps). The model stays a global, as users write it,
and the script ends with destroy_process_group() and nothing else."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from client_common import (
    maybe_crash,
    regression_step,
    synthetic_regression,
    training_started,
    weights_digest,
    write_result,
)
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--ckpt-dir", required=True)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--every", type=int, default=5)
args = parser.parse_args()


def newest_checkpoint(root: str) -> tuple[int, str] | None:
    done = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        path = os.path.join(root, name)
        if name.startswith("step_") and os.path.exists(os.path.join(path, ".metadata")):
            done.append((int(name.removeprefix("step_")), path))
    return max(done) if done else None


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
start, resumed_from = 0, None
found = newest_checkpoint(args.ckpt_dir)
if found is not None:
    start, path = found
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    resumed_from = start
data = synthetic_regression(args.steps * 16 * world, 32)
loss = torch.zeros(())
training_started()
for step in range(start, args.steps):
    maybe_crash(step)
    loss = regression_step(model, optimizer, data, step, rank, world)
    if (step + 1) % args.every == 0:
        model_state, optim_state = get_state_dict(model, optimizer)
        path = os.path.join(args.ckpt_dir, f"step_{step + 1}")
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
write_result(
    args.out,
    args.steps - start,
    weights=weights_digest(model.module.state_dict()),
    loss=float(loss.detach()),
    resumed_from=resumed_from,
)
dist.destroy_process_group()
