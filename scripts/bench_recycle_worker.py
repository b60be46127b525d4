"""One worker of scripts/bench_recycle.py, started by torchrun: a DP x PP pipeline whose
stage ops take fixed times, scheduled by torch's Schedule1F1B or by rtrain's
ScheduleReCycle following a plan for a failure set (ReCycle's, or the drop-the-replicas
baseline's). Writes <out>/rank<R>.json: when each step ended and, with --timeline, when
each op of two steps ran.

The stage is a Linear + tanh (the last adds a Linear head). Its op times are sleeps
placed on autograd paths: F sleeps in forward; B's sleep is the backward of an identity
on the stage's input, which only the input gradient goes through; W's is the backward
of an identity on the weight, which only the weight gradient goes through. A fused
backward (torch's 1F1B) passes both. So the schedule, not the 2-core machine's
matmuls, sets the iteration time; the activations are real and cross real gloo links.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.nn import functional

from rtrain.core.layout.recycle import failure_plan
from rtrain.core.planner.job import PipelineJob
from rtrain.core.worker.pipelining import ScheduleReCycle, recycle_stage
from rtrain.core.worker.recycle import worker_plan


class SleepOnBackward(torch.autograd.Function):
    """The identity; its backward sleeps `seconds` (a fixed-cost gradient op)."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class TimedStage(nn.Module):
    def __init__(self, hidden: int, last: bool, f: float, b: float, w: float) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.linear = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 1) if last else None
        self.f, self.b, self.w = f, b, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.f)
        x = SleepOnBackward.apply(x, self.b)
        weight = SleepOnBackward.apply(self.linear.weight, self.w)
        h = torch.tanh(functional.linear(x, weight, self.linear.bias))
        return self.head(h) if self.head is not None else h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, required=True)
    parser.add_argument("--pp", type=int, required=True)
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--schedule", choices=("torch-1f1b", "recycle", "drop"), required=True)
    parser.add_argument("--fail", action="append", default=[])
    parser.add_argument("--profile", required=True, help="JSON: forward, backward_input, ...")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--timeline-steps", type=int, nargs=2, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    profile = json.loads(args.profile)
    dp, pp, m = args.dp, args.pp, args.microbatches
    job = PipelineJob.from_profile(profile, dp, pp, m)
    hidden, batch = 16, 8 * m

    def stage_module(stage: int) -> TimedStage:
        return TimedStage(
            hidden,
            stage == pp - 1,
            job.forward[stage],
            job.backward_input[stage],
            job.backward_weight[stage],
        )

    def data(replica: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        generator = torch.Generator().manual_seed(replica)
        inputs = torch.randn(batch, hidden, generator=generator)
        return (inputs,), torch.randn(batch, 1, generator=generator)

    if args.schedule == "torch-1f1b":
        replica, stage_index = divmod(rank, pp)
        pipelines = [dist.new_group([r * pp + s for s in range(pp)]) for r in range(dp)]
        stage_groups = [dist.new_group([r * pp + s for r in range(dp)]) for s in range(pp)]
        module = stage_module(stage_index)
        stage = PipelineStage(
            module, stage_index, pp, torch.device("cpu"), group=pipelines[replica]
        )
        schedule = Schedule1F1B(stage, m, loss_fn=functional.mse_loss)
        (x,), y = data(replica)
        x.requires_grad_(True)  # stage 0's B runs in the fused backward, as in the plan

        def train_step() -> None:
            if stage.is_first:
                schedule.step(x)
            elif stage.is_last:
                schedule.step(target=y)
            else:
                schedule.step()
            if dp > 1:  # one all-reduce of the flat gradient, as ScheduleReCycle's "sum"
                grads = [p.grad for p in module.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=stage_groups[stage_index])
                torch.nn.utils.vector_to_parameters(flat, grads)

        recorder = None
    else:
        failed = [tuple(int(v) for v in f.split(":")) for f in args.fail]
        plan = worker_plan(failure_plan(job, failed, args.schedule), rank)
        assert plan.stage is not None and plan.replica is not None
        stage_index, replica = plan.stage, plan.replica
        module = stage_module(stage_index)
        recorder = ScheduleReCycle(
            recycle_stage(module, "cpu", plan),
            m,
            functional.mse_loss,
            plan=plan,
            reduction="sum",
            record_timings=True,
        )
        (x,), y = data(replica)

        def train_step() -> None:
            recorder.step(x, target=y, batch_of=data)

    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    ends: list[float] = []
    optimizer_spans: list[tuple[float, float]] = []
    dist.barrier()
    for _ in range(args.iterations):
        optimizer.zero_grad()
        train_step()
        began = time.monotonic()
        optimizer.step()
        time.sleep(job.optimizer[stage_index])
        ends.append(time.monotonic())
        optimizer_spans.append((began, ends[-1]))

    record: dict[str, Any] = {"rank": rank, "stage": stage_index, "replica": replica, "ends": ends}
    if recorder is not None and args.timeline_steps is not None:
        ops = []
        for step in args.timeline_steps:
            for t in recorder.timings[step]:
                end = optimizer_spans[step][1] if t.op == "OPT" else t.end
                ops.append([t.op, step, t.replica, t.microbatch, t.ready, end])
        record["ops"] = ops
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
