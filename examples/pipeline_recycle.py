"""Pipeline-parallel training that follows rtrain's ReCycle plan, over gloo on the CPU.

    rtrain launch --standalone --nproc-per-node=4 --pp=2 \\
        --recycle-profile=examples/recycle_profile.json examples/pipeline_recycle.py

Each worker holds one stage of a small MLP: the (replica, stage) its plan gives it. A
training step runs the worker's actions for one iteration, in the plan's order:

  F  the forward of one micro-batch: the activation comes from the worker that ran the
     previous stage of that micro-batch, the output goes to the next;
  B  its input gradient: from the next stage's gradient, sent to the previous stage;
  W  its weight gradient, kept per micro-batch.

Then the workers of each stage add up the weight gradients of every micro-batch of every
replica, in one fixed order, and take the same SGD step. (The plan's staggered optimizer
steps are not followed: each step ends with one synchronous update.)

When a node is lost, rtrain restarts the survivors with a plan in which the failed
worker's same-stage peers also run its micro-batches (ReCycle), and every worker restores
its stage from the in-memory snapshot of the last step. Each micro-batch's gradient is
computed from the same inputs and weights, whoever computes it, and they are added in the
same order, so the weights stay bitwise those of a run that lost nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from rtrain.core import WorkerPlan, recycle_worker_plan, restore, snapshot
from torch import nn

Key = tuple[int, int]  # (replica, micro-batch)
FORWARD, BACKWARD = 0, 1  # message directions, part of the gloo tag


def make_stage(stage: int, pp: int, hidden: int) -> nn.Module:
    torch.manual_seed(1000 + stage)  # every replica of a stage starts from the same weights
    layers: list[nn.Module] = [nn.Linear(hidden, hidden), nn.Tanh()]
    if stage == pp - 1:
        layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def microbatch(step: int, key: Key, size: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch `key` of step `step`: a fixed function of the three, so runs repeat."""
    replica, index = key
    generator = torch.Generator().manual_seed((step * 1_000 + replica) * 1_000 + index)
    inputs = torch.randn(size, hidden, generator=generator)
    teacher = torch.randn(hidden, 1, generator=torch.Generator().manual_seed(42)) / hidden**0.5
    return inputs, torch.tanh(inputs @ teacher)


class StageWorker:
    """Runs one worker's plan actions for a step and returns its weight gradients."""

    def __init__(self, plan: WorkerPlan, args: argparse.Namespace) -> None:
        assert plan.position is not None
        self.plan = plan
        self.stage = plan.position[1]
        self.last = self.stage == plan.pp - 1
        self.module = make_stage(self.stage, plan.pp, args.hidden)
        self.size, self.hidden = args.microbatch_size, args.hidden
        self.actions = [a for a in plan.actions if a["iteration"] == 0 and a["op"] in "FBW"]
        # the loss of every micro-batch is scaled so that the summed gradient is the mean
        self.scale = 1.0 / (plan.dp * plan.microbatches)

    def stage_ranks(self) -> list[int]:
        """The ranks that hold this worker's stage, in any replica."""
        holders = self.plan.holders.items()
        return [rank for pos, ranks in holders if pos[1] == self.stage for rank in ranks]

    def rank_of(self, position: list[int]) -> int:
        return self.plan.holders[(position[0], position[1])][0]

    def tag(self, key: Key, direction: int) -> int:
        return (key[0] * self.plan.microbatches + key[1]) * 2 + direction

    def run_step(self, step: int) -> tuple[dict[Key, torch.Tensor], float]:
        """This worker's weight gradient of every micro-batch it ran, and their mean loss
        (last stage)."""
        params = list(self.module.parameters())
        inputs: dict[Key, torch.Tensor] = {}
        outputs: dict[Key, torch.Tensor] = {}
        upstream: dict[Key, torch.Tensor | None] = {}
        grads: dict[Key, torch.Tensor] = {}
        sends: list[Any] = []
        losses: list[float] = []
        for action in self.actions:
            key = (action["replica"], action["microbatch"])
            if action["op"] == "F":
                x, target = microbatch(step, key, self.size, self.hidden)
                if self.stage > 0:
                    x = torch.empty(self.size, self.hidden)
                    src = self.rank_of(action["recv_from"])
                    dist.recv(x, src=src, tag=self.tag(key, FORWARD))
                    x.requires_grad_()
                out = self.module(x)
                if self.last:
                    loss = nn.functional.mse_loss(out, target)
                    losses.append(loss.item())
                    out = loss * self.scale
                else:
                    dst = self.rank_of(action["send_to"])
                    sends.append(dist.isend(out.detach(), dst=dst, tag=self.tag(key, FORWARD)))
                inputs[key], outputs[key] = x, out
            elif action["op"] == "B":
                grad_out = None
                if not self.last:
                    grad_out = torch.empty(self.size, self.hidden)
                    src = self.rank_of(action["recv_from"])
                    dist.recv(grad_out, src=src, tag=self.tag(key, BACKWARD))
                upstream[key] = grad_out
                if self.stage > 0:
                    (grad_in,) = torch.autograd.grad(
                        outputs[key], inputs[key], grad_out, retain_graph=True
                    )
                    dst = self.rank_of(action["send_to"])
                    sends.append(dist.isend(grad_in, dst=dst, tag=self.tag(key, BACKWARD)))
            else:  # W
                weight_grads = torch.autograd.grad(outputs[key], params, upstream.pop(key))
                grads[key] = torch.cat([g.reshape(-1) for g in weight_grads])
                del inputs[key], outputs[key]
        for work in sends:
            work.wait()
        return grads, sum(losses) / max(len(losses), 1)

    def apply(self, total: torch.Tensor, lr: float) -> None:
        offset = 0
        with torch.no_grad():
            for param in self.module.parameters():
                param -= lr * total[offset : offset + param.numel()].view_as(param)
                offset += param.numel()

    def digest(self) -> str:
        data = b"".join(p.detach().numpy().tobytes() for p in self.module.parameters())
        return hashlib.sha256(data).hexdigest()


def stage_gradient(stage: int | None, grads: dict[Key, torch.Tensor], plan: WorkerPlan):
    """Every worker's gradients, gathered; this stage's summed over every micro-batch of
    every replica, in (replica, micro-batch) order, so the sum does not depend on who
    computed what."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (stage, grads))
    if stage is None:
        return None
    mine: dict[Key, torch.Tensor] = {}
    for other_stage, other in gathered:
        if other_stage == stage:
            overlap = set(mine) & set(other)
            if overlap:
                raise RuntimeError(f"stage {stage}: micro-batches {sorted(overlap)} ran twice")
            mine.update(other)
    expected = {(r, m) for r in range(plan.dp) for m in range(plan.microbatches)}
    if set(mine) != expected:
        raise RuntimeError(f"stage {stage}: micro-batches {sorted(expected - set(mine))} missing")
    total = torch.zeros_like(next(iter(mine.values())))
    for key in sorted(mine):
        total += mine[key]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--microbatch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds (for drills)")
    parser.add_argument("--record", default="", help="folder for a JSON summary per worker")
    args = parser.parse_args()

    plan = recycle_worker_plan()
    if plan is None:
        raise SystemExit(
            "pipeline_recycle.py: no ReCycle plan; run it with "
            "rtrain launch --pp=N --recycle-profile=FILE"
        )
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    worker = StageWorker(plan, args) if plan.position is not None else None
    start = 0
    restored = restore()
    if restored is not None:  # every rank, with a part in the plan or not, goes on from here
        state, done = restored
        start = done + 1
    if restored is not None and worker is not None:
        if state["stage"] != worker.stage:
            raise SystemExit(
                f"rank {rank}: restored stage {state['stage']}, plan says {worker.stage}"
            )
        with torch.no_grad():
            for param, saved in zip(worker.module.parameters(), state["params"], strict=True):
                param.copy_(saved)
    if worker is not None and plan.failed and start < args.steps:
        print(
            f"rank {rank}: position {plan.position}, {len(worker.actions)} actions per step "
            f"(failed: {plan.failed})",
            flush=True,
        )

    for step in range(start, args.steps):
        grads, loss = worker.run_step(step) if worker is not None else ({}, 0.0)
        total = stage_gradient(worker.stage if worker else None, grads, plan)  # every rank
        if worker is not None:
            assert total is not None
            worker.apply(total, args.lr)
            snapshot({"stage": worker.stage, "params": list(worker.module.parameters())}, step)
        else:  # no part in the plan (a node that joined later): nothing to keep but the step
            snapshot({"stage": None, "params": []}, step)
        reports = step % 10 == 0 or step == args.steps - 1
        if reports and worker is not None and worker.last and rank == min(worker.stage_ranks()):
            print(f"step {step:4d}  loss {loss:.5f}", flush=True)
        if args.record and rank == 0:
            with open(os.path.join(args.record, "progress"), "w") as handle:
                handle.write(str(step + 1))
        time.sleep(args.step_sleep)

    if worker is not None:
        if rank == min(worker.stage_ranks()):
            print(f"stage {worker.stage}: params sha256 {worker.digest()}", flush=True)
        if args.record:
            forwards = sum(1 for a in worker.actions if a["op"] == "F")
            summary = {
                "rank": rank,
                "generation": int(os.environ.get("RTRAIN_GENERATION", "0")),
                "position": list(plan.position),
                "stage": worker.stage,
                "forwards_per_step": forwards,
                "first_step": start,  # > 0: resumed from an in-memory snapshot
                "digest": worker.digest(),
                "failed": [list(w) for w in plan.failed],
            }
            with open(os.path.join(args.record, f"final_rank{rank}.json"), "w") as handle:
                json.dump(summary, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
