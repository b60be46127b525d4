"""A DDP training job written once for repair in place (rtrain.repairable).

The model and optimizer are built once per process, outside the training function: a
survivor keeps them (and its process) into the next generation, where the function
re-wraps DDP on the new group and restores the newest step every rank committed into
them. Deterministic on the CPU (each step's data depends only on (step, rank)), so a
run with faults ends bitwise equal to one without.

Writes $PROBE_OUT/enter_gen<G>_rank<R>.json at each entry (pid, repairs so far, when
its process was created),
first_step_gen<G>_rank<R>.json when a generation after the first completes its first
step (t, step),
$PROBE_OUT/final_rank<R>.json (pid, digest of parameters and optimizer state) and, on
rank 0, $PROBE_OUT/progress (steps applied). Faults: PROBE_FAULT="rank=R,step=S,
action=kill|stop|raise[,gen=G]" (raise: a RuntimeError of its own; in generation G,
0 if not given, once), several separated by ";" (the first writes fault.json, the
i-th faulti.json); PROBE_IGNORE=R: rank R, once its collective breaks, never leaves
the function (a survivor that ignores the repair request; its replacement ignores the
next one too).
A step of -1 is the function's entry (its group open, before the first step).
PROBE_DIE_ON_BREAK=R, PROBE_DIE_PARKED=R: a second fault during generation 0's repair
(second_fault). PROBE_USAGE=1: each entry records the process's resources (usage).
PROBE_NO_REPAIR=1: the same job without opting in (every fault restarts every worker).
"""

import contextlib
import hashlib
import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from probe_io import usage
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rtrain

OUT = os.environ.get("PROBE_OUT", "")
STEPS = int(os.environ.get("PROBE_STEPS", "40"))
PAUSE = float(os.environ.get("PROBE_STEP_SLEEP", "0.03"))

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.05, momentum=0.9)
PADDING = torch.zeros(int(float(os.environ.get("PROBE_STATE_MB", "0")) * 2**20) // 4)


def write(name: str, record: dict) -> None:
    if OUT:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, name + ".tmp"), "w") as handle:
            json.dump(record, handle)
        os.replace(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name))


def digest() -> str:
    h = hashlib.sha256()
    for p in MODEL.parameters():
        h.update(p.detach().numpy().tobytes())
    for state in OPTIMIZER.state.values():
        for key in sorted(state):
            value = state[key]
            h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def ordered_mean(_state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's gradient mean, summed in rank order: a fresh DDP (every generation) lays
    out its buckets otherwise than the rebuilt ones of a running one, and gloo's ring
    all_reduce adds each element in an order that depends on its place in the bucket,
    so the plain hook is not bitwise reproducible across a restart with 3+ ranks."""
    grad = bucket.buffer()
    parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
    gathered = dist.all_gather(parts, grad, async_op=True).get_future()

    def mean(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # raises if the gather failed (a peer died): never a partial mean
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return total / len(parts)

    return gathered.then(mean)


def inject(rank: int, step: int, generation: int) -> None:
    for index, spec in enumerate(os.environ.get("PROBE_FAULT", "").split(";")):
        fault = dict(i.split("=", 1) for i in spec.split(",") if "=" in i)
        if not fault or int(fault["rank"]) != rank or int(fault["step"]) != step:
            continue
        if int(fault.get("gen", "0")) != generation:
            continue
        name = "fault.json" if index == 0 else f"fault{index}.json"
        if os.path.exists(os.path.join(OUT, name)):
            continue
        write(name, {"t_fault": time.time(), "step": step})
        if fault.get("action") == "raise":  # its own bug, of the type torch's OOM is
            raise RuntimeError(f"rank {rank}'s own RuntimeError at step {step}")
        sig = signal.SIGSTOP if fault.get("action") == "stop" else signal.SIGKILL
        os.kill(os.getpid(), sig)


def second_fault(rank: int, generation: int) -> None:
    """A second fault in the repair of generation 0, on a survivor whose collective
    broke: PROBE_DIE_ON_BREAK=R dies before it parks, PROBE_DIE_PARKED=R once its
    control folder says it parked (before the next generation's environment comes)."""
    if generation:
        return
    if os.environ.get("PROBE_DIE_ON_BREAK") == str(rank):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("PROBE_DIE_PARKED") == str(rank):
        state = os.path.join(os.environ["RTRAIN_REPAIR_DIR"], "state.json")

        def die_once_parked() -> None:
            while True:
                with contextlib.suppress(OSError, ValueError), open(state) as handle:
                    if json.load(handle)["state"] == "parked":
                        os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.001)

        threading.Thread(target=die_once_parked, daemon=True).start()


def created() -> float:
    """When this process was forked, on the wall clock (to 10 ms): its age from /proc
    (psutil's create_time counts from the boot time, which /proc gives in whole seconds)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        up = float(uptime.read().split()[0])
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


@rtrain.repairable(backend="gloo")
def train() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    generation = rtrain.topology().generation
    entered = {"pid": os.getpid(), "repairs": rtrain.repairs(), "created": created()}
    if os.environ.get("PROBE_USAGE"):
        entered.update(usage())
    write(f"enter_gen{generation}_rank{rank}.json", entered)
    model = DDP(MODEL)  # re-wrapped on this generation's group
    model.register_comm_hook(None, ordered_mean)
    state = {"model": MODEL, "optimizer": OPTIMIZER, "padding": PADDING}
    restored = rtrain.restore(into=state)
    start = 0 if restored is None else restored[1] + 1
    if restored is not None:
        write(
            f"restored_gen{generation}_rank{rank}.json", {"step": restored[1], "digest": digest()}
        )
    ignoring = os.environ.get("PROBE_IGNORE", "") == str(rank)
    inject(rank, -1, generation)  # step=-1: entered, before the first step
    for step in range(start, STEPS):
        inject(rank, step, generation)
        data = torch.Generator().manual_seed(step * 100 + rank)
        inputs = torch.randn(8, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        OPTIMIZER.zero_grad()
        try:
            loss.backward()
        except RuntimeError:
            while ignoring:  # a survivor that never answers the repair request
                time.sleep(1)
            second_fault(rank, generation)
            raise
        OPTIMIZER.step()
        rtrain.snapshot(state, step)
        rtrain.heartbeat(step)
        if os.environ.get("PROBE_STEP_DIGESTS"):
            write(f"digest_gen{generation}_step{step}_rank{rank}.json", {"digest": digest()})
        if step == start and generation:  # the first step after a fault (the benchmark)
            write(f"first_step_gen{generation}_rank{rank}.json", {"t": time.time(), "step": step})
        if rank == 0 and OUT:
            with open(os.path.join(OUT, "progress"), "w") as handle:
                handle.write(str(step + 1))
        time.sleep(PAUSE)
    dist.barrier()
    write(f"final_rank{rank}.json", {"pid": os.getpid(), "digest": digest(), "world": world})


if __name__ == "__main__":
    if os.environ.get("PROBE_NO_REPAIR"):  # the same job without opting in: restarts
        os.environ.pop("RTRAIN_REPAIR_DIR", None)
    train()
