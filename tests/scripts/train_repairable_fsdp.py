"""An FSDP2 training job written once for repair in place (rtrain.repairable).

Each generation shards the model again on its own device mesh: the function builds the
model (from its config: a fixed seed, as a real job builds on the meta device and loads
its weights), calls fully_shard on this generation's mesh, and loads the newest save
every rank committed with torch.distributed.checkpoint over rtrain's memory
(SnapshotReader), resharding when the world size changed. A survivor keeps its process
(imports, CUDA context, data loaders); what lived on the old mesh goes with the frames
of the generation that ended.

Deterministic on the CPU: the data and noise of a step depend only on (step, global
sample), so a run with a fault that keeps the world size ends bitwise equal to one
without; across world sizes only the state at one step is compared (the float sums'
order differs), as in train_fsdp2_dcp.py.

Writes $PROBE_OUT/enter_gen<G>_rank<R>.json at each entry (pid, repairs so far, world,
whether the previous generation's process group is still alive),
restored_gen<G>_rank<R>.json after a load (step, digest of the whole state, world),
first_step_gen<G>_rank<R>.json after a later generation's first step (whether every
parameter and optimizer state lives on this generation's mesh object),
final_rank<R>.json (pid, digest of this rank's shards, digest of the whole state,
world) and, on rank 0, progress. PROBE_FULL_DIGESTS=1: rank 0 writes full_step<S>.txt,
the whole state's digest after step S. PROBE_MESH=hsdp: a 2-D mesh (this_mesh).
Faults: PROBE_FAULT as in train_repairable.py; its step=1000+S is step S just before
its dcp.save.
"""

import hashlib
import os
import time
import weakref

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_repairable import inject, write

import rtrain
from rtrain.core.worker.dcp import SnapshotReader, SnapshotWriter, restored_step

OUT = os.environ.get("PROBE_OUT", "")
STEPS = int(os.environ.get("PROBE_STEPS", "24"))
PAUSE = float(os.environ.get("PROBE_STEP_SLEEP", "0.03"))
GLOBAL_BATCH = 12  # divisible by 4, 3 and 2 ranks
SAVING = 1000  # PROBE_FAULT's step=1000+S: in step S, just before its dcp.save
LAST_GROUP: list = []  # a weak reference to the previous generation's process group


def this_mesh(world: int) -> object:
    """This generation's mesh: 1-D over the world (FSDP), or with PROBE_MESH=hsdp 2-D,
    replicated over 2 and sharded within each half (HSDP: sub-groups of the world)."""
    if os.environ.get("PROBE_MESH") == "hsdp":
        return init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh("cpu", (world,))


def build(mesh: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and optimizer, sharded on `mesh` (this generation's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 33), nn.Tanh(), nn.Linear(33, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if hasattr(value, "to_local") else value


def local_mesh(value: object) -> object:
    return getattr(value, "device_mesh", None)


def full(value: object) -> object:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def shard_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(local(p).detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key in sorted(state):
            h.update(local(state[key]).detach().numpy().tobytes())
    return h.hexdigest()


def full_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """The whole state, gathered (a collective: every rank calls it)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    h = hashlib.sha256()
    for key in sorted(model_sd):
        h.update(key.encode() + full(model_sd[key]).detach().numpy().tobytes())
    for key in sorted(optim_sd["state"]):
        for name in sorted(optim_sd["state"][key]):
            value = full(optim_sd["state"][key][name])
            h.update(f"{key}.{name}".encode() + value.detach().numpy().tobytes())
    return h.hexdigest()


@rtrain.repairable(backend="gloo", timeout_s=60)
def train() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    generation = rtrain.topology().generation
    old_group_alive = bool(LAST_GROUP) and LAST_GROUP[0]() is not None
    LAST_GROUP[:] = [weakref.ref(dist.group.WORLD)]
    entered = {"pid": os.getpid(), "repairs": rtrain.repairs(), "world": world}
    write(f"enter_gen{generation}_rank{rank}.json", {**entered, "old_group": old_group_alive})
    mesh = this_mesh(world)
    model, optimizer = build(mesh)
    start = 0
    if restored_step() is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "data": {"next_step": 0}}
        dcp.load(state, storage_reader=SnapshotReader())  # resharded if the world changed
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        start = state["data"]["next_step"]
        record = {"step": start - 1, "digest": full_digest(model, optimizer), "world": world}
        write(f"restored_gen{generation}_rank{rank}.json", record)
    inject(rank, -1, generation)
    share = GLOBAL_BATCH // world
    for step in range(start, STEPS):
        inject(rank, step, generation)
        data = torch.Generator().manual_seed(step)
        inputs = torch.randn(GLOBAL_BATCH, 16, generator=data)
        noise = 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=data)
        targets = inputs.sum(dim=1, keepdim=True) + noise
        mine = slice(rank * share, (rank + 1) * share)
        loss = nn.functional.mse_loss(model(inputs[mine]), targets[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "data": {"next_step": step + 1}}
        inject(rank, SAVING + step, generation)  # the others in dcp.save's collectives
        dcp.save(state, storage_writer=SnapshotWriter(step))
        if os.environ.get("PROBE_FULL_DIGESTS"):
            digest = full_digest(model, optimizer)
            if rank == 0:
                with open(os.path.join(OUT, f"full_step{step}.txt"), "w") as handle:
                    handle.write(digest)
        rtrain.heartbeat(step)
        if step == start and generation:  # every DTensor of the step on this mesh?
            meshes = [local_mesh(p) for p in model.parameters()]
            meshes += [local_mesh(v) for s in optimizer.state.values() for v in s.values()]
            on_mesh = all(m is None or m is mesh for m in meshes)
            write(f"first_step_gen{generation}_rank{rank}.json", {"on_this_mesh": on_mesh})
        if rank == 0 and OUT:
            with open(os.path.join(OUT, "progress.tmp"), "w") as handle:
                handle.write(str(step + 1))
            os.replace(os.path.join(OUT, "progress.tmp"), os.path.join(OUT, "progress"))
        time.sleep(PAUSE)
    final = {
        "pid": os.getpid(),
        "digest": shard_digest(model, optimizer),
        "full": full_digest(model, optimizer),
        "world": world,
    }
    dist.barrier()
    write(f"final_rank{rank}.json", final)


if __name__ == "__main__":
    train()
