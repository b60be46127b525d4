"""torch.distributed.pipelining over 2 stages (one per rank) with ScheduleGPipe or
Schedule1F1B: a manual split of an MLP into PipelineStage modules, SGD per stage."""

import argparse

import torch
import torch.distributed as dist
from client_common import step_done, training_started, weights_digest, write_result
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_module(stage: int) -> torch.nn.Module:
    torch.manual_seed(stage)
    if stage == 0:
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU())
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "two stages, one per rank"
    module = stage_module(rank)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    losses: list[torch.Tensor] = []
    schedule = SCHEDULES[args.schedule](
        stage, n_microbatches=args.microbatches, loss_fn=torch.nn.functional.mse_loss
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    training_started()
    for _ in range(args.steps):
        x = torch.randn(16, 32, generator=generator)
        y = torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=y, losses=losses)
        optimizer.step()
        step_done()
    loss = float(torch.stack(losses).mean()) if losses else None
    write_result(args.out, args.steps, weights=weights_digest(module.state_dict()), loss=loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
