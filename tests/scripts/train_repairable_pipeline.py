"""A pipeline job (torch.distributed.pipelining, rtrain's ScheduleReCycle) written once
for repair in place (rtrain.repairable).

Each stage's module and optimizer are built once per process, outside the training
function, in a table by stage (a survivor keeps its plan position into the next
generation, unless a whole stage was lost: then one moves there and builds that
stage's); the function re-reads the generation's plan, builds the
PipelineStage and the schedule on the new group, restores and trains. Run under
`rtrain launch --pp=2 --recycle-profile=examples/recycle_profile.json`.

Writes $PROBE_OUT/enter_gen<G>_rank<R>.json at each entry (pid, repairs so far, plan
position, micro-batches run per step, the failed positions), final_rank<R>.json (pid,
generation, stage, digest of the stage's parameters and optimizer state) and, on rank
0, progress (steps applied). PROBE_FAULT="rank=R,step=S[,gen=G][,at=reduce]
[,action=stop]": that rank SIGKILLs (stop: SIGSTOPs) itself before step S of generation
G (0 if not given), once; at=reduce: in that step's gradient reduction, as its stage
peers gather their gradients.
PROBE_HOLD="gen=G,after=K": in generation G every rank stops after K steps and waits
in barriers (heartbeating) until the generation ends under it (a node joins, one is
lost): the generation is sure to be running, and to end mid-run, when the test acts.
"""

import hashlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn

import rtrain
from rtrain.core import recycle_worker_plan
from rtrain.core.worker.pipelining import ScheduleReCycle, recycle_stage

OUT = os.environ.get("PROBE_OUT", "")
STEPS = int(os.environ.get("PROBE_STEPS", "30"))
PAUSE = float(os.environ.get("PROBE_STEP_SLEEP", "0.1"))
HIDDEN, BATCH = 16, 16

torch.set_num_threads(1)
STAGES: dict[int, tuple[nn.Module, torch.optim.Optimizer]] = {}  # built once a process


def stage_of(stage: int, pp: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    if stage not in STAGES:
        torch.manual_seed(1000 + stage)  # every replica of a stage starts the same
        layers: list[nn.Module] = [nn.Linear(HIDDEN, HIDDEN), nn.Tanh()]
        if stage == pp - 1:
            layers.append(nn.Linear(HIDDEN, 1))
        module = nn.Sequential(*layers)
        STAGES[stage] = (module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9))
    return STAGES[stage]


def batch(step: int, replica: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1_000 + replica)
    inputs = torch.randn(BATCH, HIDDEN, generator=generator)
    teacher = torch.randn(HIDDEN, 1, generator=torch.Generator().manual_seed(42)) / HIDDEN**0.5
    return (inputs,), torch.tanh(inputs @ teacher)


def digest(module: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key in sorted(state):
            value = state[key]
            h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def write(name: str, record: dict) -> None:
    if OUT:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, name + ".tmp"), "w") as handle:
            json.dump(record, handle)
        os.replace(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name))


FAULT = dict(i.split("=", 1) for i in os.environ.get("PROBE_FAULT", "").split(",") if "=" in i)


def inject(rank: int, step: int, generation: int, where: str = "step") -> None:
    if not FAULT or (int(FAULT["rank"]), int(FAULT["step"])) != (rank, step):
        return
    if FAULT.get("at", "step") != where or int(FAULT.get("gen", "0")) != generation:
        return
    if os.path.exists(os.path.join(OUT, "fault")):
        return
    write("fault", {"t": time.time()})
    os.kill(os.getpid(), signal.SIGSTOP if FAULT.get("action") == "stop" else signal.SIGKILL)


class Now:
    step = -1


if FAULT.get("at") == "reduce":  # the fault point: inside the stage's reduction
    from rtrain.core.worker.pipelining import reduction

    exact_total = reduction.exact_total

    def dying_total(*args: object, **kwargs: object) -> torch.Tensor:
        inject(dist.get_rank(), Now.step, rtrain.topology().generation, "reduce")
        return exact_total(*args, **kwargs)  # type: ignore[arg-type]

    reduction.exact_total = dying_total


def hold(ran: int, step: int, generation: int) -> None:
    spec = os.environ.get("PROBE_HOLD", "")
    found = dict(i.split("=", 1) for i in spec.split(",") if "=" in i)
    if not found or (int(found["gen"]), int(found["after"])) != (generation, ran):
        return
    write(f"held_gen{generation}_rank{dist.get_rank()}", {"t": time.time()})
    while True:  # a released group's barrier raises: the function unwinds, parks
        dist.barrier()
        rtrain.heartbeat(step)
        time.sleep(0.05)


@rtrain.repairable(backend="gloo", timeout_s=60)
def train() -> None:
    plan = recycle_worker_plan()  # this generation's: re-read at every entry
    assert plan is not None, "run under rtrain launch --pp=N --recycle-profile=FILE"
    rank, generation = dist.get_rank(), rtrain.topology().generation
    if plan.stage is None:  # no position this generation
        dist.barrier()
        return
    module, optimizer = stage_of(plan.stage, plan.pp)
    state = {"stage": plan.stage, "model": module, "optimizer": optimizer}
    restored = rtrain.restore(into=state)
    first = 0 if restored is None else restored[1] + 1
    # the stage and the schedule hold this generation's groups: built anew each time
    schedule = ScheduleReCycle(
        recycle_stage(module, "cpu", plan), plan.microbatches, nn.functional.mse_loss, plan=plan
    )
    entered = {
        "pid": os.getpid(),
        "repairs": rtrain.repairs(),
        "position": list(plan.position or ()),
        "forwards_per_step": len(schedule.microbatch_keys),
        "failed": [list(w) for w in plan.failed],
        "first_step": first,
    }
    write(f"enter_gen{generation}_rank{rank}.json", entered)
    for step in range(first, STEPS):
        inject(rank, step, generation)
        Now.step = step
        hold(step - first, step, generation)

        def batch_of(replica: int, step: int = step) -> tuple[tuple[torch.Tensor], torch.Tensor]:
            return batch(step, replica)

        inputs, target = batch_of(schedule.replica)
        optimizer.zero_grad()
        schedule.step(*inputs, target=target, batch_of=batch_of)
        optimizer.step()
        rtrain.snapshot(state, step)
        rtrain.heartbeat(step)
        if rank == 0 and OUT:
            with open(os.path.join(OUT, "progress"), "w") as handle:
                handle.write(str(step + 1))
        time.sleep(PAUSE)
    dist.barrier()
    final = {
        "pid": os.getpid(),
        "generation": generation,
        "stage": plan.stage,
        "position": list(plan.position or ()),
        "digest": digest(module, optimizer),
    }
    write(f"final_rank{rank}.json", final)


if __name__ == "__main__":
    train()
