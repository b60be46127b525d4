"""FSDP2 (fully_shard over gloo on the CPU) keeping its state with rtrain's snapshot():
the module, the optimizer and a data position go in as Stateful objects, the RNG state
as a tensor, and a restarted worker loads them back in place with restore(into=...)
(PROBE_RESTORE_PLAIN=1: with restore() alone, then each object's load_state_dict).

Deterministic: the data of a step depends only on (step, rank) and the noise on the
restored RNG state, so a run with failures ends bitwise equal to one without. Writes
$PROBE_OUT/final_rank<R>.json (sha256 of this rank's parameter and optimizer shards)
and $PROBE_OUT/restored_gen<G>_rank<R>.json. Faults as in train_snapshot.py.
"""

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_snapshot import inject

from rtrain.core import heartbeat, restore, snapshot


class Position:
    """Where the data stream is: Stateful, as a real data loader's position is."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if hasattr(value, "to_local") else value


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(local(p).detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key in sorted(state):
            h.update(local(state[key]).detach().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "12"))
    out = os.environ["PROBE_OUT"]
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    position = Position()
    torch.manual_seed(1000 + rank)
    state = {"model": model, "optim": optimizer, "data": position, "rng": torch.get_rng_state()}
    if os.environ.get("PROBE_RESTORE_PLAIN"):  # restore() alone, then load by hand
        restored = restore()
        if restored is not None:
            saved = restored[0]
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optim"])
            position.load_state_dict(saved["data"])
            state["rng"] = saved["rng"]
    else:
        restored = restore(into=state)
    if restored is not None:
        torch.set_rng_state(state["rng"])
        record = {"step": position.step - 1, "digest": digest(model, optimizer)}
        with open(os.path.join(out, f"restored_gen{generation}_rank{rank}.json"), "w") as f:
            json.dump(record, f)
    while position.step < steps:
        step = position.step
        inject(rank, step, generation, out)
        data = torch.Generator().manual_seed(step * 100 + rank)
        inputs = torch.randn(8, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(8, 1)  # global RNG
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        position.step = step + 1
        state["rng"] = torch.get_rng_state()
        snapshot(state, step)
        heartbeat(step)
        if rank == 0:
            with open(os.path.join(out, "progress.tmp"), "w") as handle:
                handle.write(str(step + 1))
            os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.03")))
    dist.barrier()
    with open(os.path.join(out, f"final_rank{rank}.json"), "w") as handle:
        json.dump({"digest": digest(model, optimizer), "generation": generation}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
