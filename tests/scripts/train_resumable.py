"""A resumable training job for rtrain's recovery tests and benchmarks.

A small linear model trained by plain data parallelism over gloo: every step has a
fixed global batch of 12 samples, split evenly across the world (1, 2, 3, 4, 6 or 12
workers), and gradients are averaged by all_reduce. So the trained weights depend on
the number of steps, not on the world size, and a run that loses a node and goes on
with fewer workers must end with the same weights as one that did not.

Rank 0 checkpoints after every step to $PROBE_CKPT (atomic rename); a restarted
generation resumes from it. Every step calls rtrain.core.heartbeat(step).

Records to $PROBE_OUT/gen<G>_rank<R>.json: world size, topology(), the first and last
step of the generation and when they completed. Faults, torchft-style, through
PROBE_FAULT="rank=R,step=S,gen=G,action=A" (gen may be a/b/c): exit, kill, stop
(SIGSTOP itself), deadlock (blocks on a lock inside deadlocked_here()).
PROBE_STEPS (default 20), PROBE_STEP_SLEEP (seconds, default 0.05).
PROBE_HOLD_WORLD=N: a generation whose world size is N stops before its last step (still
heartbeating) until the agent replaces it: a test's way to keep a shrunk generation
running until a node rejoins, whatever the machine's load.
"""

import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from rtrain.core import heartbeat, recycle_actions, topology

GLOBAL_BATCH = 12
FEATURES = 8


def parse_fault() -> dict[str, str]:
    text = os.environ.get("PROBE_FAULT", "")
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def deadlocked_here() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns: the hang the agent must find


def inject(fault: dict[str, str], rank: int, step: int, generation: int) -> None:
    if not fault or int(fault.get("rank", -1)) != rank or int(fault.get("step", -1)) != step:
        return
    if generation not in {int(g) for g in fault.get("gen", "0").split("/")}:
        return
    action = fault.get("action", "exit")
    out = os.environ.get("PROBE_OUT", "")
    if out:
        with open(os.path.join(out, f"fault_rank{rank}.json"), "w") as handle:
            json.dump({"t_fault": time.time(), "step": step, "action": action}, handle)
    print(f"probe: injecting {action} on rank {rank} at step {step}", flush=True)
    if action == "exit":
        sys.exit(3)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if action == "deadlock":
        deadlocked_here()


def hold_until_replaced(step: int) -> None:
    while True:  # the agent ends this generation (SIGTERM) when the world changes
        heartbeat(step)
        time.sleep(0.1)


def load(path: str) -> tuple[torch.Tensor, int]:
    if path and os.path.exists(path):
        state = torch.load(path)
        return state["weights"], state["applied"]
    return torch.zeros(FEATURES, 1, dtype=torch.float64), 0


def save(path: str, weights: torch.Tensor, applied: int) -> None:
    torch.save({"weights": weights, "applied": applied}, path + ".tmp")
    os.replace(path + ".tmp", path)


def _count_kinds(actions: list[dict] | None) -> dict[str, int] | None:
    if actions is None:
        return None
    counts: dict[str, int] = {}
    for action in actions:
        counts[action["op"]] = counts.get(action["op"], 0) + 1
    return counts


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "20"))
    pause = float(os.environ.get("PROBE_STEP_SLEEP", "0.05"))
    out, ckpt = os.environ.get("PROBE_OUT", ""), os.environ.get("PROBE_CKPT", "")
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fault = parse_fault()
    if out:
        os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"world size {world} does not divide the global batch {GLOBAL_BATCH}")
    weights, applied = load(ckpt)
    seeded = torch.Generator().manual_seed(7)
    truth = torch.randn(FEATURES, 1, generator=seeded, dtype=torch.float64)
    view = topology()
    record = {
        "world_size": world,
        "topology": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(view).items()},
        # With --recycle-profile, after a loss: this worker's ReCycle actions, by kind.
        "recycle": _count_kinds(recycle_actions()),
        "first_step": applied,
        "t_start": time.time(),
    }
    for step in range(applied, steps):
        inject(fault, rank, step, generation)
        if step == steps - 1 and world == int(os.environ.get("PROBE_HOLD_WORLD", "0")):
            hold_until_replaced(step)
        gen = torch.Generator().manual_seed(1000 + step)
        inputs = torch.randn(GLOBAL_BATCH, FEATURES, generator=gen, dtype=torch.float64)
        targets = inputs @ truth
        mine = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        error = inputs[mine] @ weights - targets[mine]
        grad = 2 * inputs[mine].T @ error / error.shape[0]
        dist.all_reduce(grad)
        weights -= 0.05 * grad / world
        applied += 1
        if rank == 0 and ckpt:
            save(ckpt, weights, applied)
        if rank == 0 and out:
            with open(os.path.join(out, "progress.tmp"), "w") as handle:
                handle.write(str(applied))
            os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
        heartbeat(step)
        if step == record["first_step"]:
            record["t_first_step"] = time.time()
        time.sleep(pause)
    record.update({"applied": applied, "weights": weights.flatten().tolist(), "t_end": time.time()})
    dist.barrier()
    dist.destroy_process_group()
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"gen{generation}_rank{rank}.json"), "w") as handle:
            json.dump(record, handle)
    print(f"rank {rank} generation {generation}: {applied} steps applied", flush=True)


if __name__ == "__main__":
    main()
