"""A training job that keeps its state with rtrain.core.snapshot() and comes back with
rtrain.core.restore(): model, Adam state, the global RNG state and the step.

Deterministic on the CPU: the data of each step depends only on (step, rank) and the
noise on the restored RNG state, so a run with failures must end bitwise equal to one
without. Writes $PROBE_OUT/final_rank<R>.json (sha256 of parameters and optimizer
state) and $PROBE_OUT/restored_gen<G>_rank<R>.json (the step and digest restored);
with PROBE_STEP_DIGESTS=1, rank 0 writes $PROBE_OUT/digest_step<S>.txt after each step.
Faults as in train_resumable.py
(PROBE_FAULT="rank=R,step=S,gen=G,action=exit|kill"). PROBE_STATE_MB pads the state
with a buffer of that size, for the benchmark.
"""

import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from rtrain.core import heartbeat, restore, snapshot


def inject(rank: int, step: int, generation: int, out: str) -> None:
    fault = dict(i.split("=", 1) for i in os.environ.get("PROBE_FAULT", "").split(",") if "=" in i)
    if not fault or int(fault.get("rank", -1)) != rank or int(fault.get("step", -1)) != step:
        return
    if generation not in {int(g) for g in fault.get("gen", "0").split("/")}:
        return
    if os.path.exists(os.path.join(out, "fault.json")):
        return  # once per job, also across fresh launches (a requeued job)
    with open(os.path.join(out, "fault.json"), "w") as handle:
        json.dump({"t_fault": time.time(), "step": step}, handle)
    print(f"probe: injecting {fault.get('action')} on rank {rank} at step {step}", flush=True)
    if fault.get("action") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key in sorted(state):
            value = state[key]
            h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "30"))
    pause = float(os.environ.get("PROBE_STEP_SLEEP", "0.03"))
    out = os.environ.get("PROBE_OUT", "")
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if out:
        os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    padding = torch.zeros(int(float(os.environ.get("PROBE_STATE_MB", "0")) * 2**20) // 4)
    torch.manual_seed(1000 + rank)
    start = 0
    t0 = time.time()
    disk = os.environ.get("PROBE_DISK_CKPT", "")  # the torchrun way: torch.save every step
    disk_file = os.path.join(disk, f"rank{rank}.pt") if disk else ""
    restored = restore(copy=False)  # the fast path; test_snapshot_api covers copy=True
    if restored is None and disk_file and os.path.exists(disk_file):
        restored = torch.load(disk_file)
    if restored is not None:
        state, step = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = step + 1
        if out:
            record = {
                "step": step,
                "seconds": time.time() - t0,
                "t": time.time(),
                "digest": digest(model, optimizer),
            }
            with open(os.path.join(out, f"restored_gen{generation}_rank{rank}.json"), "w") as f:
                json.dump(record, f)
    for step in range(start, steps):
        inject(rank, step, generation, out)
        data = torch.Generator().manual_seed(step * 100 + rank)
        inputs = torch.randn(8, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(8, 1)  # global RNG
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "padding": padding,
            "note": f"rank {rank}",
        }
        snapshot(state, step)
        if rank == 0 and out and os.environ.get("PROBE_STEP_DIGESTS"):
            with open(os.path.join(out, f"digest_step{step}.txt"), "w") as handle:
                handle.write(digest(model, optimizer))
        if disk_file:
            torch.save((state, step), disk_file + ".tmp")
            os.replace(disk_file + ".tmp", disk_file)
        if step == start and restored is not None and out:
            with open(os.path.join(out, f"first_step_gen{generation}_rank{rank}.json"), "w") as f:
                json.dump({"t": time.time(), "step": step}, f)
        heartbeat(step)
        if rank == 0 and out:
            with open(os.path.join(out, "progress.tmp"), "w") as handle:
                handle.write(str(step + 1))
            os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
        time.sleep(pause)
    dist.barrier()
    dist.destroy_process_group()
    if out:
        with open(os.path.join(out, f"final_rank{rank}.json"), "w") as handle:
            json.dump({"digest": digest(model, optimizer), "generation": generation}, handle)


if __name__ == "__main__":
    main()
