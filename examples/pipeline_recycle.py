"""Pipeline-parallel training with torch.distributed.pipelining, scheduled by ReCycle.

    rtrain launch --standalone --nproc-per-node=4 --pp=2 \\
        --recycle-profile=examples/recycle_profile.json examples/pipeline_recycle.py

Each worker holds one stage of a small MLP, a torch PipelineStage at the (replica,
stage) position its plan gives it, and steps it with rtrain's ScheduleReCycle where a
torchtitan-style script would use Schedule1F1B: same arguments, and fault-free the
same weights, bitwise. After every step the stage's module and optimizer go into an
in-memory snapshot.

When a node is lost, rtrain restarts the survivors with a plan in which the lost
worker's same-stage peers in the other replicas also run its micro-batches (they hold
the same parameters), loading that replica's data (batch_of). Every worker restores
its plan position's state; a node that joins later takes the lost position over and
restores it from a DP peer of that stage. Each micro-batch's gradient is computed from
the same inputs and weights whoever computes it, and the stage adds them up in one
fixed order, so the weights stay bitwise those of a run that lost nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from rtrain.core import WorkerPlan, recycle_worker_plan, restore, snapshot
from rtrain.core.worker.pipelining import ScheduleReCycle, recycle_stage


def make_stage(stage: int, pp: int, hidden: int) -> nn.Module:
    torch.manual_seed(1000 + stage)  # every replica of a stage starts from the same weights
    layers: list[nn.Module] = [nn.Linear(hidden, hidden), nn.Tanh()]
    if stage == pp - 1:
        layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def batch(
    step: int, replica: int, size: int, hidden: int
) -> tuple[tuple[torch.Tensor], torch.Tensor]:
    """Replica `replica`'s batch of step `step`, (inputs, target): a fixed function of the
    two, so that any worker can load any replica's batch and runs repeat."""
    generator = torch.Generator().manual_seed(step * 1_000 + replica)
    inputs = torch.randn(size, hidden, generator=generator)
    teacher = torch.randn(hidden, 1, generator=torch.Generator().manual_seed(42)) / hidden**0.5
    return (inputs,), torch.tanh(inputs @ teacher)


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()


def write_record(path: str, record: dict) -> None:
    """Whole or not at all: a drill reads these files while the job runs."""
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


def record_final(
    args: argparse.Namespace,
    plan: WorkerPlan,
    schedule: ScheduleReCycle,
    first: int,
    module: nn.Module,
) -> None:
    summary = {
        "rank": plan.rank,
        "generation": int(os.environ.get("RTRAIN_GENERATION", "0")),
        "position": list(plan.position or ()),
        "stage": plan.stage,
        "forwards_per_step": len(schedule.microbatch_keys),
        "first_step": first,  # > 0: resumed from an in-memory snapshot
        "digest": digest(module),
        "failed": [list(w) for w in plan.failed],
    }
    write_record(os.path.join(args.record, f"final_rank{plan.rank}.json"), summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds (for drills)")
    parser.add_argument("--record", default="", help="folder for a JSON summary per worker")
    args = parser.parse_args()
    torch.set_num_threads(1)

    plan = recycle_worker_plan()
    if plan is None:
        raise SystemExit(
            "pipeline_recycle.py: no ReCycle plan; run it with "
            "rtrain launch --pp=N --recycle-profile=FILE"
        )
    dist.init_process_group("gloo")
    if plan.stage is None:  # more nodes than plan positions: nothing to run this time
        dist.destroy_process_group()
        return

    module = make_stage(plan.stage, plan.pp, args.hidden)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    state = {"stage": plan.stage, "model": module, "optimizer": optimizer}
    first = 0
    restored = restore(into=state)
    if restored is not None:
        if state["stage"] != plan.stage:
            raise SystemExit(
                f"rank {plan.rank}: restored stage {state['stage']}, plan says {plan.stage}"
            )
        first = restored[1] + 1
    if args.record:  # where each position runs this generation, for drills
        generation = os.environ.get("RTRAIN_GENERATION", "0")
        where = {"pid": os.getpid(), "position": list(plan.position or ()), "first_step": first}
        write_record(os.path.join(args.record, f"gen{generation}_rank{plan.rank}.json"), where)
    schedule = ScheduleReCycle(
        recycle_stage(module, "cpu", plan), plan.microbatches, nn.functional.mse_loss, plan=plan
    )
    if plan.failed and first < args.steps:
        keys = len(schedule.microbatch_keys)
        print(f"rank {plan.rank}: position {plan.position}, {keys} micro-batches per step")
    # the lowest rank of each stage speaks for it
    stage_ranks = [r for pos, ranks in plan.holders.items() if pos[1] == plan.stage for r in ranks]
    speaks = plan.rank == min(stage_ranks)

    for step in range(first, args.steps):

        def batch_of(replica: int, step: int = step) -> tuple[tuple[torch.Tensor], torch.Tensor]:
            return batch(step, replica, args.batch_size, args.hidden)

        inputs, target = batch_of(schedule.replica)
        losses: list[torch.Tensor] = []
        optimizer.zero_grad()
        schedule.step(*inputs, target=target, losses=losses, batch_of=batch_of)
        optimizer.step()
        snapshot(state, step)
        if speaks and losses and (step % 10 == 0 or step == args.steps - 1):
            loss = sum(x.item() for x in losses) / len(losses)
            print(f"step {step:4d}  loss {loss:.5f}", flush=True)
        if args.record and plan.rank == 0:
            with open(os.path.join(args.record, "progress"), "w") as handle:
                handle.write(str(step + 1))
        time.sleep(args.step_sleep)

    if speaks:
        print(f"stage {plan.stage}: params sha256 {digest(module)}", flush=True)
    if args.record:
        record_final(args, plan, schedule, first, module)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
