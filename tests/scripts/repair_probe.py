"""A repairable worker for tests that play the agent themselves (the control files of
core/contract/repair_files.py): all_reduce in a loop, PROBE_STEPS steps a generation.

Writes $PROBE_OUT/enter_gen<G>_rank<R>.json at each entry (pid, world size, repairs)
and $PROBE_OUT/done_gen<G>_rank<R>.json (the sum of the last all_reduce), and
$PROBE_OUT/step_rank<R> (steps done in this generation) after every step.
PROBE_RAISE=R: rank R raises ValueError at its third step (its own bug, not a peer's).
PROBE_GROUP_TIMEOUT: the group's timeout in seconds (120).
PROBE_KEEP_DEVICE=cuda|cpu: a tensor made once per process on that device, whose
address and sum each entry records (scripts/gpu_repair_check.py: it survives a repair).
"""

import json
import os
import time

import torch
import torch.distributed as dist

import rtrain

OUT = os.environ["PROBE_OUT"]
DEVICE = os.environ.get("PROBE_KEEP_DEVICE")
KEPT = torch.arange(1 << 20, dtype=torch.float32, device=DEVICE) if DEVICE else None


def write(name: str, record: object) -> None:
    with open(os.path.join(OUT, name + ".tmp"), "w") as handle:
        json.dump(record, handle)
    os.replace(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name))


@rtrain.repairable(backend="gloo", timeout_s=float(os.environ.get("PROBE_GROUP_TIMEOUT", "120")))
def train() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    generation = int(os.environ["RTRAIN_GENERATION"])
    record = {"pid": os.getpid(), "world": world, "repairs": rtrain.repairs()}
    if KEPT is not None:
        record.update(kept_ptr=KEPT.data_ptr(), kept_sum=float(KEPT.sum().item()))
    write(f"enter_gen{generation}_rank{rank}.json", record)
    total = torch.zeros(1 << 16)
    for step in range(int(os.environ.get("PROBE_STEPS", "1000000"))):  # the env may change
        if os.environ.get("PROBE_RAISE") == str(rank) and step == 3:
            raise ValueError("a bug of this rank's own")
        total = torch.full((1 << 16,), float(rank + 1))
        dist.all_reduce(total)
        write(f"step_rank{rank}", step + 1)
        time.sleep(0.01)
    write(f"done_gen{generation}_rank{rank}.json", {"sum": float(total[0])})


if __name__ == "__main__":
    train()
