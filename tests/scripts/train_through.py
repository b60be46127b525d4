"""A data-parallel job written for train-through (rtrain.repairable(train_through=True)).

Each step's data is a function of (step, logical rank) only; the script takes its
logical ranks from rtrain.data_ranks() and averages by rtrain.average_gradients(), so
a run whose survivors did a failed rank's share ends bitwise equal to one without a
fault. Runs unchanged under torchrun (one logical rank per process).

PROBE_STARTUP_S=S: a process started in a generation after the first (a replacement),
or a warm spare (--spares-per-node), sleeps S seconds at module level: a GPU process's
cold start. PROBE_FAULT as in
train_repairable.py ("rank=R,step=S,action=kill|stop[,gen=G]", ";"-separated; nth=N
instead of step=S: at the N-th step of the function's call).
PROBE_STOP_AFTER=G: the training ends after 10 steps at full size in generation G.
PROBE_SLOW_RANK=R, PROBE_SLOW_S=S: rank R sleeps S seconds for each logical rank it
holds (a slow rank, for tests/integration/test_stragglers.py; unset: none).
PROBE_STARTUP_FAULT=crash|hang: the first replacement exits 3, or sleeps an hour, at
module level (after its start-up sleep). Writes to $PROBE_OUT: fault.json (t_fault),
steps_rank<R>.jsonl (one line per step done: t, generation, group world size, logical
ranks, pid), final_rank<R>.json (pid, digest), progress (rank 0: steps done) and with
PROBE_USAGE=1 usage_rank<R>.jsonl (the process's resources at each generation's first
step).
"""

import json
import os
import signal
import time

import torch
import torch.distributed as dist
from probe_io import digest, usage, write
from torch import nn

import rtrain

OUT = os.environ.get("PROBE_OUT", "")
if OUT:
    os.makedirs(OUT, exist_ok=True)
STEPS = int(os.environ.get("PROBE_STEPS", "40"))
PAUSE = float(os.environ.get("PROBE_STEP_SLEEP", "0.03"))
SLOW_RANK = int(os.environ.get("PROBE_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("PROBE_SLOW_S", "0"))
if int(os.environ.get("RTRAIN_GENERATION", "0") or 0) > 0 or "RTRAIN_SPARE" in os.environ:
    time.sleep(float(os.environ.get("PROBE_STARTUP_S", "0")))  # a cold start
    # PROBE_STARTUP_FAULT=crash|hang: the first replacement fails in its start-up
    MARK = os.path.join(OUT, "startup_fault")
    if os.environ.get("PROBE_STARTUP_FAULT") and not os.path.exists(MARK):
        open(MARK, "w").close()
        if os.environ["PROBE_STARTUP_FAULT"] == "crash":
            raise SystemExit(3)
        time.sleep(3600)

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.05, momentum=0.9)


def inject(rank: int, step: int, generation: int, nth: int) -> None:
    """nth: the steps this call of the function has done (a fault with nth=N instead of
    step=S strikes at this process's N-th step of its generation)."""
    for index, spec in enumerate(os.environ.get("PROBE_FAULT", "").split(";")):
        fault = dict(i.split("=", 1) for i in spec.split(",") if "=" in i)
        if not fault or int(fault["rank"]) != rank:
            continue
        if int(fault.get("step", -2)) != step and int(fault.get("nth", -2)) != nth:
            continue
        if int(fault.get("gen", "0")) != generation:
            continue
        name = "fault.json" if index == 0 else f"fault{index}.json"
        if os.path.exists(os.path.join(OUT, name)):
            continue
        write(OUT, name, {"t_fault": time.time(), "step": step})
        os.kill(os.getpid(), signal.SIGSTOP if fault.get("action") == "stop" else signal.SIGKILL)


@rtrain.repairable(backend="gloo", train_through=True)
def train() -> None:
    rank = int(os.environ.get("RANK", "0"))
    generation = rtrain.topology().generation
    state = {"model": MODEL, "optimizer": OPTIMIZER}
    restored = rtrain.restore(into=state)
    start = 0 if restored is None else restored[1] + 1
    stop_after = int(os.environ.get("PROBE_STOP_AFTER", "0"))
    for step in range(start, STEPS):
        full = dist.get_world_size() == int(os.environ["WORLD_SIZE"])
        if stop_after and generation >= stop_after and full and step - start >= 10:
            break  # every rank alike: they entered this call at the same step
        logical = rtrain.data_ranks()  # the step boundary: a warm replacement joins here
        inject(rank, step, generation, step - start)
        grads = {}
        for data_rank in logical:
            if rank == SLOW_RANK:
                time.sleep(SLOW_S)
            data = torch.Generator().manual_seed(step * 100 + data_rank)
            inputs = torch.randn(8, 16, generator=data)
            targets = inputs.sum(dim=1, keepdim=True)
            OPTIMIZER.zero_grad()
            nn.functional.mse_loss(MODEL(inputs), targets).backward()
            grads[data_rank] = [p.grad.clone() for p in MODEL.parameters()]
        rtrain.average_gradients(MODEL.parameters(), grads)
        OPTIMIZER.step()
        rtrain.snapshot(state, step)
        rtrain.heartbeat(step)
        if OUT and rank == 0:
            with open(os.path.join(OUT, "progress"), "w") as handle:
                handle.write(str(step + 1))
        if OUT and os.environ.get("PROBE_USAGE") and step == start:
            with open(os.path.join(OUT, f"usage_rank{rank}.jsonl"), "a") as handle:
                handle.write(json.dumps({"generation": generation, **usage()}) + "\n")
        if OUT:
            line = {
                "t": time.time(),
                "step": step,
                "generation": generation,
                "world": dist.get_world_size(),
                "logical": list(logical),
                "pid": os.getpid(),
            }
            with open(os.path.join(OUT, f"steps_rank{rank}.jsonl"), "a") as handle:
                handle.write(json.dumps(line) + "\n")
        time.sleep(PAUSE)
    dist.barrier()
    write(OUT, f"final_rank{rank}.json", {"pid": os.getpid(), "digest": digest(MODEL, OPTIMIZER)})


if __name__ == "__main__":
    train()
