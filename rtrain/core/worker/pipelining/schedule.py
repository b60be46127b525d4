"""ScheduleReCycle: a torch.distributed.pipelining schedule that runs this worker's part
of rtrain's ReCycle plan.

torch's schedules (ScheduleGPipe, Schedule1F1B, ...) run the same micro-batch count on
every stage of one pipeline group and talk to fixed neighbours. A ReCycle plan breaks
both rules after a failure: a lost worker's micro-batches are re-routed to the workers
of the same stage in the other replicas, so a worker runs more micro-batches than its
peers and receives activations from, and sends them to, workers of other pipelines.
This schedule takes the user's PipelineStage and torch's schedule arguments and
follows the plan's action list for the current generation instead:

  F  a micro-batch's forward: its input from the worker that ran the previous stage of
     that micro-batch (wire.py), its output to the next;
  B  the input gradient only (decoupled from W, so W can fill bubbles), sent back;
  W  the weight gradient, kept per micro-batch;
  OPT the stage's gradient reduction (reduction.py) among the workers of this stage:
     the optimizer step that follows needs nothing from the other stages, so stages
     step at different times (the plan's staggered optimizer), with no barrier
     across the pipeline.

It builds on the stage's public surface (submod, stage_index, num_stages, is_first,
is_last, device) and plain autograd; no private torch API. Over gloo, activations are
sent with tags (a micro-batch's and direction's own). NCCL has no tags: it matches the
messages between two ranks by their order alone, so over any backend but gloo they
are sent untagged, and a plan is run only if every receiver takes its messages in the
order their sender sends them (WorkerPlan.messages_in_order; every plan the planner
made in this project's tests and benchmarks is). Untagged runs are tested over gloo
with tags off, which matches by order too; not on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

from ..recycle import WorkerPlan
from . import reduction, wire
from .plan_checks import (
    PlanMismatch,
    check_generation,
    check_schedule,
    current_generation,
    plan_or_file,
)

Key = tuple[int, int]  # (replica, micro-batch)
Batch = tuple[tuple[Any, ...], torch.Tensor | None]  # (stage-0 inputs, target)
FORWARD, BACKWARD = 0, 1


@dataclass
class _InFlight:
    """A micro-batch between its F and its W on this worker."""

    inputs: tuple[torch.Tensor, ...]
    head: torch.Tensor  # what the backward starts from: the loss, or the stage's output
    grad_out: torch.Tensor | None = None


@dataclass
class OpTiming:
    """When one action ran (time.monotonic(), the same clock in every process here):
    it began at `start`, its input had arrived at `ready` (the same unless it waited for
    a peer's activation or gradient) and it ended at `end`."""

    op: str
    replica: int | None
    microbatch: int | None
    start: float
    ready: float
    end: float


@dataclass
class _Step:
    """One call of step(): its micro-batches' data and what is in flight."""

    args: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    targets: dict[Key, torch.Tensor | None] = field(default_factory=dict)
    live: dict[Key, _InFlight] = field(default_factory=dict)
    outputs: dict[Key, torch.Tensor] = field(default_factory=dict)
    losses: dict[Key, torch.Tensor] = field(default_factory=dict)
    sent: wire.Sent = field(default_factory=wire.Sent)
    ready: float | None = None  # when the running action's input arrived from a peer


def recycle_stage(
    submodule: torch.nn.Module,
    device: torch.device | str = "cpu",
    plan: WorkerPlan | None = None,
) -> PipelineStage:
    """A PipelineStage for this worker's plan position: the stage index and count from
    the plan. Its communication group is this rank alone: ScheduleReCycle does the
    stage's communication, so the stage needs no pipeline group (after a loss there is
    no fixed one), and torch refuses a group larger than the number of stages."""
    plan = plan_or_file(plan)
    if plan.stage is None:
        raise PlanMismatch(f"rank {plan.rank} holds no position in the ReCycle plan")
    alone = dist.new_group([plan.rank], use_local_synchronization=True)
    return PipelineStage(submodule, plan.stage, plan.pp, torch.device(device), group=alone)


class ScheduleReCycle:
    """Run this worker's ReCycle actions for one iteration per step() call.

    stage, n_microbatches, loss_fn and scale_grads are torch's schedule arguments; the
    plan is this generation's (rtrain launch --recycle-profile writes it; pass plan= to
    run one made otherwise). reduction: "exact" (bitwise independent of failures) or
    "sum" (cheaper); see reduction.py. record_timings keeps when each action began, had
    its input and ended in .timings (the benchmark's measured timeline). tagged: send
    activations with tags (None: where the stage device's backend is gloo).

    step() takes this worker's replica's whole batch like torch's step(): `args` on the
    first stage, `target` on the last. After a failure a worker also runs micro-batches
    of other replicas: `batch_of(replica)` gives that replica's (args, target) for the
    same iteration (the data a lost worker would have loaded). When step() returns, the
    stage's parameters hold the stage's reduced gradient in .grad; step the optimizer.
    """

    def __init__(
        self,
        stage: PipelineStage,
        n_microbatches: int,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        *,
        plan: WorkerPlan | None = None,
        scale_grads: bool = True,
        reduction: str = "exact",
        record_timings: bool = False,
        tagged: bool | None = None,
    ) -> None:
        plan = plan_or_file(plan)
        self.tagged = check_schedule(plan, stage, n_microbatches, reduction, tagged)
        assert plan.position is not None
        self.plan = plan
        self.replica: int = plan.position[0]
        self._stage = stage
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self._scale = scale_grads
        self._reduction = reduction
        self._actions = [a for a in plan.actions if a["iteration"] == 0]
        if loss_fn is None:  # forward only, as torch's schedules without a loss
            self._actions = [a for a in self._actions if a["op"] == "F"]
        self._params = [p for p in stage.submod.parameters() if p.requires_grad]
        if len({p.dtype for p in self._params}) > 1:
            raise PlanMismatch("the stage's parameters must share one dtype")
        peers = sorted(
            r for pos, ranks in plan.holders.items() if pos[1] == plan.stage for r in ranks
        )
        self._group = (
            dist.new_group(peers, use_local_synchronization=True) if len(peers) > 1 else None
        )
        self._pending: dict[Key, torch.Tensor] = {}  # "exact": W's gradients until OPT
        self._sum: torch.Tensor | None = None  # "sum": their running sum
        self._step_count = 0
        self._generation = current_generation()  # its groups are this generation's
        self.record_timings = record_timings
        self.timings: list[list[OpTiming]] = []

    @property
    def microbatch_keys(self) -> list[Key]:
        """The (replica, micro-batch) pairs this worker runs each iteration, in order."""
        return [(a["replica"], a["microbatch"]) for a in self._actions if a["op"] == "F"]

    def step(
        self,
        *args: Any,
        target: torch.Tensor | None = None,
        losses: list[torch.Tensor] | None = None,
        batch_of: Callable[[int], Batch] | None = None,
    ) -> torch.Tensor | None:
        """One iteration; on the last stage, this replica's outputs (merged) are returned
        and its micro-batches' losses appended to `losses`."""
        if self._loss_fn is not None and not torch.is_grad_enabled():
            raise RuntimeError("step() computes gradients: it cannot run under torch.no_grad()")
        check_generation(self._generation, "this ScheduleReCycle is")
        state = _Step()
        self._split(state, args, target, batch_of)
        timings: list[OpTiming] = []
        for action in self._actions:
            began, state.ready = time.monotonic(), None
            self._run(action, state)
            if self.record_timings:
                key = (action["replica"], action["microbatch"])
                ready = began if state.ready is None else state.ready
                timings.append(OpTiming(action["op"], *key, began, ready, time.monotonic()))
        # Not on an error: a send to a peer that died may never complete, and the error
        # must reach the script (its exit is what the agent acts on).
        state.sent.wait()
        if self.record_timings:
            self.timings.append(timings)
        self._step_count += 1
        mine = sorted(k for k in state.outputs if k[0] == self.replica)
        if losses is not None:
            losses.extend(state.losses[k] for k in mine if k in state.losses)
        if not self._stage.is_last or not mine:
            return None
        return torch.cat([state.outputs[k] for k in mine])

    # -- the actions ------------------------------------------------------------------

    def _run(self, action: dict[str, Any], state: _Step) -> None:
        op = action["op"]
        if op == "F":
            self._forward(action, state)
        elif op == "B":
            self._backward_input(action, state)
        elif op == "W":
            self._backward_weight(action, state)
        elif op == "OPT":
            self._reduce(state)

    def _forward(self, action: dict[str, Any], state: _Step) -> None:
        key = (action["replica"], action["microbatch"])
        stage = self._stage
        if stage.is_first:
            inputs = tuple(_leaf(x, self._loss_fn is not None) for x in state.args[key])
        else:
            source = self._rank_at(action["recv_from"])
            received = wire.recv(source, self._tag(key, FORWARD), stage.device)
            state.ready = time.monotonic()
            inputs = (received.requires_grad_(self._loss_fn is not None),)
        output = stage.submod(*inputs)
        if stage.is_last:
            state.outputs[key] = output.detach()
            if self._loss_fn is None:
                return
            loss = self._loss_fn(output, state.targets[key])
            state.losses[key] = loss.detach()
            state.live[key] = _InFlight(inputs, loss)
            return
        if not isinstance(output, torch.Tensor):
            raise TypeError(
                f"stage {stage.stage_index} returned {type(output).__name__}: "
                "ScheduleReCycle sends one tensor between stages"
            )
        state.sent.send(output, self._rank_at(action["send_to"]), self._tag(key, FORWARD))
        if self._loss_fn is not None:
            state.live[key] = _InFlight(inputs, output)

    def _backward_input(self, action: dict[str, Any], state: _Step) -> None:
        key = (action["replica"], action["microbatch"])
        flight = state.live[key]
        if not self._stage.is_last:
            source = self._rank_at(action["recv_from"])
            flight.grad_out = wire.recv(source, self._tag(key, BACKWARD), self._stage.device)
            state.ready = time.monotonic()
        wanted = [t for t in flight.inputs if t.requires_grad]
        if not wanted:  # integer inputs (token ids): W runs the whole backward
            return
        grads = torch.autograd.grad(
            flight.head, wanted, flight.grad_out, retain_graph=True, allow_unused=True
        )
        if not self._stage.is_first:
            grad = grads[0] if grads[0] is not None else torch.zeros_like(wanted[0])
            state.sent.send(grad, self._rank_at(action["send_to"]), self._tag(key, BACKWARD))

    def _backward_weight(self, action: dict[str, Any], state: _Step) -> None:
        key = (action["replica"], action["microbatch"])
        flight = state.live.pop(key)
        grads = torch.autograd.grad(flight.head, self._params, flight.grad_out, allow_unused=True)
        flat = reduction.flatten(
            [
                g if g is not None else torch.zeros_like(p)
                for g, p in zip(grads, self._params, strict=True)
            ]
        )
        if self._reduction == "exact":
            self._pending[key] = flat
        elif self._sum is None:
            self._sum = flat
        else:
            self._sum += flat

    def _reduce(self, state: _Step) -> None:
        if not self._params:
            return
        plan = self.plan
        if self._reduction == "exact":
            total = reduction.exact_total(
                self._pending, self._group, plan.dp, plan.microbatches, self._scale
            )
        else:
            mine = (
                self._sum
                if self._sum is not None
                else reduction.flatten([torch.zeros_like(p) for p in self._params])
            )
            total = reduction.sum_total(mine, self._group, plan.dp, plan.microbatches, self._scale)
        reduction.unflatten_into(total, self._params)
        self._pending = {}
        self._sum = None

    # -- helpers ----------------------------------------------------------------------

    def _rank_at(self, position: Sequence[int]) -> int:
        return self.plan.holders[(int(position[0]), int(position[1]))][0]

    def _tag(self, key: Key, direction: int) -> int | None:
        """Unique per micro-batch and direction within a step, alternating between steps
        (a fast stage may send the next step's while a slow one still receives); None
        when untagged (the plan's order keeps messages apart)."""
        if not self.tagged:
            return None
        index = key[0] * self.plan.microbatches + key[1]
        per_step = self.plan.dp * self.plan.microbatches
        return ((self._step_count % 2) * per_step + index) * 2 + direction

    def _split(
        self,
        state: _Step,
        args: tuple[Any, ...],
        target: torch.Tensor | None,
        batch_of: Callable[[int], Batch] | None,
    ) -> None:
        """Each micro-batch this worker runs: its stage-0 inputs and its target."""
        stage = self._stage
        if not (stage.is_first or stage.is_last):
            return
        replicas = sorted({k[0] for k in self.microbatch_keys})
        for replica in replicas:
            if replica == self.replica:
                batch_args, batch_target = args, target
            elif batch_of is None:
                raise PlanMismatch(
                    f"this worker also runs replica {replica}'s micro-batches (a re-routed "
                    "plan): step() needs batch_of=... to load that replica's batch"
                )
            else:
                batch_args, batch_target = batch_of(replica)
            chunks, _ = (
                split_args_kwargs_into_chunks(tuple(batch_args), {}, self._n_microbatches)
                if stage.is_first
                else ([()] * self._n_microbatches, None)
            )
            targets: list[Any] = [None] * self._n_microbatches
            if stage.is_last and self._loss_fn is not None:
                if batch_target is None:
                    raise PlanMismatch("the last stage's step() needs target=")
                targets = [
                    c[0]
                    for c in split_args_kwargs_into_chunks(
                        (batch_target,), {}, self._n_microbatches
                    )[0]
                ]
            for m in range(self._n_microbatches):
                state.args[(replica, m)] = chunks[m]
                state.targets[(replica, m)] = targets[m]


def _leaf(value: Any, grad: bool) -> Any:
    """A stage-0 input as a fresh autograd leaf; floating point inputs take a gradient
    so that B, not W, carries the input side of the backward (as on later stages)."""
    if not isinstance(value, torch.Tensor):
        return value
    leaf = value.detach()
    return leaf.requires_grad_(grad and leaf.is_floating_point())
