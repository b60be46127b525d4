"""FSDP2 (fully_shard) training on CPU over gloo; the full weights are gathered at the
end (torch.distributed.checkpoint.state_dict) so both launchers can be compared."""

import argparse

import torch
import torch.distributed as dist
from client_common import (
    regression_step,
    synthetic_regression,
    training_started,
    weights_digest,
    write_result,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = synthetic_regression(args.steps * 16 * dist.get_world_size(), 32)
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.zeros(())
    training_started()
    for step in range(args.steps):
        loss = regression_step(model, optimizer, data, step, rank, world)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    write_result(args.out, args.steps, weights=weights_digest(full), loss=float(loss.detach()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
