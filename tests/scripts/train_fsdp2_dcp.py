"""FSDP2 saving every step with torch.distributed.checkpoint into rtrain's memory
(SnapshotWriter), torchtitan style: get_state_dict / set_state_dict and dcp.save/load,
the storage swapped and nothing else. A restarted job loads with SnapshotReader, from
local memory or peers' memory, resharding when it has fewer ranks than the one that
saved (a node lost: DP shrank).

Deterministic: the data and noise of a step depend only on (step, global sample), so
the whole state at a step does not depend on how many ranks trained it... except for
the float sums' order; the test compares states at one step, not runs across sizes.
With PROBE_FULL_DIGESTS=1 rank 0 writes $PROBE_OUT/full_step<S>.txt, the sha256 of the
whole (gathered) model and optimizer state after step S; after a load it writes
$PROBE_OUT/restored_gen<G>.json with the step and the same digest. Faults as in
train_snapshot.py, and PROBE_FAIL_AFTER_LOAD (fail_after_load).
"""

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_snapshot import inject

from rtrain.core import heartbeat
from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

GLOBAL_BATCH = 12


def full(value):
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def full_digest(model_sd: dict, optim_sd: dict) -> str:
    """The whole state, gathered (a collective: every rank calls it)."""
    h = hashlib.sha256()
    for key in sorted(model_sd):
        h.update(key.encode() + full(model_sd[key]).detach().numpy().tobytes())
    for key in sorted(optim_sd["state"]):
        for name in sorted(optim_sd["state"][key]):
            value = full(optim_sd["state"][key][name])
            h.update(f"{key}.{name}".encode() + value.detach().numpy().tobytes())
    return h.hexdigest()


def fail_after_load(rank: int, generation: int, out: str) -> None:
    """PROBE_FAIL_AFTER_LOAD=G: rank 0 of generation G exits right after its load,
    before any save (once per job): a second failure before the next save."""
    if os.environ.get("PROBE_FAIL_AFTER_LOAD") != str(generation) or rank != 0:
        return
    marker = os.path.join(out, "failed_after_load")
    if os.path.exists(marker):
        return
    open(marker, "w").close()
    print(f"probe: failing after the load of generation {generation}", flush=True)
    os._exit(3)


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "16"))
    out = os.environ["PROBE_OUT"]
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 33), nn.Tanh(), nn.Linear(33, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start = 0
    if restored_step() is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "data": {"next_step": 0}}
        dcp.load(state, storage_reader=SnapshotReader())
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        start = state["data"]["next_step"]
        digest = full_digest(*get_state_dict(model, optimizer))
        if rank == 0:
            with open(os.path.join(out, f"restored_gen{generation}.json"), "w") as handle:
                json.dump({"step": start - 1, "digest": digest, "world": world}, handle)
        fail_after_load(rank, generation, out)
    share = GLOBAL_BATCH // world
    for step in range(start, steps):
        inject(rank, step, generation, out)
        data = torch.Generator().manual_seed(step)
        inputs = torch.randn(GLOBAL_BATCH, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(
            GLOBAL_BATCH, 1, generator=data
        )
        mine = slice(rank * share, (rank + 1) * share)
        loss = nn.functional.mse_loss(model(inputs[mine]), targets[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "data": {"next_step": step + 1}}
        dcp.save(state, storage_writer=SnapshotWriter(step))
        if os.environ.get("PROBE_FULL_DIGESTS"):
            digest = full_digest(model_sd, optim_sd)
            if rank == 0:
                with open(os.path.join(out, f"full_step{step}.txt"), "w") as handle:
                    handle.write(digest)
        heartbeat(step)
        if rank == 0:
            with open(os.path.join(out, "progress.tmp"), "w") as handle:
                handle.write(str(step + 1))
            os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.05")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
