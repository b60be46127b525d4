"""One pipeline-parallel job, scheduled by torch's Schedule1F1B or by rtrain's
ScheduleReCycle (optionally with planned failures), for parity tests. Run by torchrun:

    torchrun --standalone --nproc-per-node=4 pipeline_parity.py --dp 2 --pp 2 \\
        --schedule 1f1b --out DIR
    torchrun --standalone --nproc-per-node=3 pipeline_parity.py --dp 2 --pp 2 \\
        --schedule recycle --fail 1:1 --out DIR [--untagged]

Every rank writes DIR/rank<R>.json: its stage, position and the sha256 of its stage's
parameters after the last step. Ranks are the surviving (replica, stage) positions in
order; the data of a micro-batch depends only on (step, replica), whoever runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from rtrain.core.layout.recycle import failure_plan
from rtrain.core.planner.job import PipelineJob
from rtrain.core.worker.pipelining import ScheduleReCycle, recycle_stage
from rtrain.core.worker.recycle import worker_plan


def make_stage(stage: int, pp: int, hidden: int) -> nn.Module:
    torch.manual_seed(1000 + stage)  # every replica of a stage starts from the same weights
    layers: list[nn.Module] = [nn.Linear(hidden, hidden), nn.Tanh()]
    if stage == pp - 1:
        layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def batch(step: int, replica: int, size: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1_000 + replica)
    inputs = torch.randn(size, hidden, generator=generator)
    teacher = torch.randn(hidden, 1, generator=torch.Generator().manual_seed(42)) / hidden**0.5
    return inputs, torch.tanh(inputs @ teacher)


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()


def dp_average(module: nn.Module, group: dist.ProcessGroup | None, dp: int) -> None:
    """Schedule1F1B's reference DP step: each replica's gradient divided by DP (as DDP
    does), summed over the replicas in replica order."""
    if dp == 1:
        return
    for param in module.parameters():
        assert param.grad is not None
        param.grad.div_(dp)
        parts = [torch.empty_like(param.grad) for _ in range(dp)]
        dist.all_gather(parts, param.grad, group=group)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        param.grad.copy_(total)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, required=True)
    parser.add_argument("--pp", type=int, required=True)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", choices=("1f1b", "recycle"), required=True)
    parser.add_argument("--fail", action="append", default=[])
    parser.add_argument("--untagged", action="store_true", help="as over NCCL: by order")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dp, pp, m = args.dp, args.pp, args.microbatches
    loss_fn = nn.functional.mse_loss

    if args.schedule == "1f1b":
        replica, stage_index = divmod(rank, pp)
        # every rank makes every group, in the same order
        pipelines = [dist.new_group([r * pp + s for s in range(pp)]) for r in range(dp)]
        stages = [dist.new_group([r * pp + s for r in range(dp)]) for s in range(pp)]
        module = make_stage(stage_index, pp, args.hidden)
        stage = PipelineStage(
            module, stage_index, pp, torch.device("cpu"), group=pipelines[replica]
        )
        torch_schedule = Schedule1F1B(stage, m, loss_fn=loss_fn)
        position = [replica, stage_index]

        def train_step(step: int) -> None:
            x, y = batch(step, replica, args.batch, args.hidden)
            if stage.is_first:
                torch_schedule.step(x)
            elif stage.is_last:
                torch_schedule.step(target=y)
            else:
                torch_schedule.step()
            dp_average(module, stages[stage_index], dp)

    else:
        failed = [tuple(int(v) for v in f.split(":")) for f in args.fail]
        job = PipelineJob.uniform(dp, pp, m, 1.0, 1.0, 1.0, 0.2, 0.05)
        plan = worker_plan(failure_plan(job, failed, "recycle"), rank)
        assert plan.position is not None
        stage_index = plan.position[1]
        module = make_stage(stage_index, pp, args.hidden)
        stage = recycle_stage(module, "cpu", plan)
        untagged = False if args.untagged else None  # None: tags where the backend has them
        schedule = ScheduleReCycle(stage, m, loss_fn, plan=plan, tagged=untagged)
        position = list(plan.position)

        def train_step(step: int) -> None:
            def batch_of(replica: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
                inputs, target = batch(step, replica, args.batch, args.hidden)
                return (inputs,), target

            (x,), y = batch_of(schedule.replica)
            schedule.step(x, target=y, batch_of=batch_of)

    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    for step in range(args.steps):
        optimizer.zero_grad()
        train_step(step)
        optimizer.step()

    record = {"rank": rank, "stage": stage_index, "position": position, "digest": digest(module)}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
