"""A data-parallel job with one rank slowed on purpose (issue 49: slow ranks found and
worked around), and the benchmark's workload (scripts/bench_straggler.py).

Each step's data is a function of (step, logical rank) only: the script takes its
logical ranks from rtrain.data_ranks() and averages by rtrain.average_gradients(), so
however rtrain spreads the logical ranks the run ends bitwise equal. Runs unchanged
under torchrun. RTRAIN_MICRO_BATCHES=M (rtrain's own variable): M logical ranks a
worker, so that work can move off a slow one.

PROBE_SLOW_RANK=R and PROBE_SLOW_S=S: rank R sleeps S seconds for each logical rank it
holds (a slow GPU: its work per micro-batch takes longer). PROBE_WORK_S=W: every rank
sleeps W seconds per logical rank besides (the compute on a GPU, without loading this
machine's CPUs). PROBE_STEPS (default 120). Writes to $PROBE_OUT: steps_rank<R>.jsonl
(t, step, logical ranks), final_rank<R>.json (digest, seconds from the first step to
the last, boundary_s: seconds inside data_ranks()), progress (rank 0: steps done).
"""

import json
import os
import time

import torch
import torch.distributed as dist
from probe_io import digest, write
from torch import nn

import rtrain

OUT = os.environ.get("PROBE_OUT", "")
STEPS = int(os.environ.get("PROBE_STEPS", "120"))
SLOW_RANK = int(os.environ.get("PROBE_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("PROBE_SLOW_S", "0"))
WORK_S = float(os.environ.get("PROBE_WORK_S", "0"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    lines = []
    began = None
    boundary = 0.0  # seconds in rtrain.data_ranks(): the balancing's agreement
    for step in range(STEPS):
        entered = time.perf_counter()
        logical = rtrain.data_ranks()
        boundary += time.perf_counter() - entered
        if began is None:
            began = time.perf_counter()
        grads = {}
        for data_rank in logical:
            time.sleep(WORK_S + (SLOW_S if rank == SLOW_RANK else 0.0))
            data = torch.Generator().manual_seed(step * 100 + data_rank)
            inputs = torch.randn(8, 16, generator=data)
            targets = inputs.sum(dim=1, keepdim=True)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(inputs), targets).backward()
            grads[data_rank] = [p.grad.clone() for p in model.parameters()]
        rtrain.average_gradients(model.parameters(), grads)
        optimizer.step()
        rtrain.heartbeat(step)
        lines.append({"t": time.time(), "step": step, "logical": list(logical)})
        if OUT and rank == 0:
            with open(os.path.join(OUT, "progress"), "w") as handle:
                handle.write(str(step + 1))
    seconds = time.perf_counter() - (began or time.perf_counter())
    dist.barrier()
    if OUT:
        with open(os.path.join(OUT, f"steps_rank{rank}.jsonl"), "w") as handle:
            handle.writelines(json.dumps(line) + "\n" for line in lines)
        final = {"digest": digest(model, optimizer), "seconds": seconds, "steps": STEPS}
        final["boundary_s"] = boundary
        write(OUT, f"final_rank{rank}.json", final)
    dist.destroy_process_group()


if __name__ == "__main__":
    if OUT:
        os.makedirs(OUT, exist_ok=True)
    main()
