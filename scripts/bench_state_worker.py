"""The training job scripts/bench_state.py launches: DDP or FSDP2 on the CPU over gloo,
with a model whose parameters and Adam moments come to --state-mb per rank, keeping
its state every step in one of three ways:

  none       no snapshot (the baseline step)
  snapshot   rtrain.core.snapshot() of {model, optimizer} (Stateful objects)
  dcp        dcp.save(..., SnapshotWriter(step)) of get_state_dict(model, optimizer)

Rank 0 writes $BENCH_OUT/steps.json: the step times after --warmup steps, the time
inside snapshot() or dcp.save of each, and a plain memory copy of the rank's state
(the same bytes, tensor to tensor). BENCH_CORES (e.g. "0") pins the workers to those
cores, leaving the others to the agent's replication. In dcp mode
with --disk DIR it also saves step --disk-step to DIR with DCP's FileSystemWriter, and
a restarted job (fewer ranks: a node was lost) times dcp.load from peer memory (the
shards its agent prefetched, then the same fetched on demand), then dcp.load of the
disk copy with its files evicted from the page cache, and DCP's fixed cost (a load of
the data position alone, from each), and writes $BENCH_OUT/restore.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from rtrain.core import heartbeat, snapshot


def build(state_mb: float, world: int, fsdp: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 1024
    # Adam keeps two moments per parameter: a third of the state is parameters.
    params = int(state_mb * 2**20 / 4 / 3)
    layers = max(params // (width * width), 1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, optimizer


def evict(directory: str) -> None:
    """Drop a checkpoint's files from the page cache: the next read goes to the disk."""
    for path in glob.glob(os.path.join(directory, "**", "*"), recursive=True):
        if os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _load(source: str, disk: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """BENCH_PROFILE=source,...: the profile of those loads in $BENCH_OUT."""
    if source not in os.environ.get("BENCH_PROFILE", "").split(","):
        return _timed_load(source, disk, model, optimizer)
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        return _timed_load(source, disk, model, optimizer)
    finally:
        profile.disable()
        path = os.path.join(os.environ["BENCH_OUT"], f"{source}_rank{dist.get_rank()}.txt")
        with open(path, "w") as handle:
            pstats.Stats(profile, stream=handle).sort_stats("tottime").print_stats(30)


def _timed_load(source: str, disk: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """One dcp.load, timed: (name -> seconds) of dcp.load alone and with set_state_dict.
    source: memory (SnapshotReader) or disk (FileSystemReader, its files evicted first);
    'tiny' in it loads the data position alone (DCP's fixed cost: the planning
    collectives and the metadata, almost no bytes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from rtrain.core.worker.dcp import SnapshotReader

    tiny = source.startswith("tiny")
    state: dict = {"data": {"next": 0}}
    if not tiny:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state.update(model=model_sd, optim=optim_sd)
    if "disk" in source:
        evict(disk)
    dist.barrier()
    began = time.perf_counter()
    reader = dcp.FileSystemReader(disk) if "disk" in source else SnapshotReader()
    dcp.load(state, storage_reader=reader)
    loaded = time.perf_counter() - began
    if not tiny:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    dist.barrier()
    return {
        source: time.perf_counter() - began,
        f"{source}_dcp_load": loaded,
        "next": state["data"]["next"],
    }


def restore_timings(disk: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The loads a restarted job times, in this order: a tiny load from memory first
    (DCP's one-time costs, paid before any timed load); the disk copy, evicted; the
    resharding load from memory with the prefetched files hidden (each shard fetched on
    demand during the load: the path before the prefetch); the same reading the shards
    the agent prefetched (the model keeps this one's state); then the tiny loads from
    memory and from disk: DCP's fixed cost."""
    directory = os.environ.get("RTRAIN_SNAPSHOT_DIR", "")
    timings = _load("tiny_warmup", disk, model, optimizer)
    timings.update(_load("disk", disk, model, optimizer))
    # One worker per node here: no other worker reads these files meanwhile.
    prefetched = glob.glob(os.path.join(directory, "prefetched-*.shard"))
    for path in prefetched:
        os.rename(path, path + ".hidden")
    dist.barrier()
    timings.update(_load("memory_on_demand", disk, model, optimizer))
    for path in prefetched:
        os.rename(path + ".hidden", path)
    dist.barrier()
    timings.update(_load("memory", disk, model, optimizer))
    start = timings["next"]
    timings["prefetched_files"] = len(prefetched)
    for source in ("tiny_memory", "tiny_disk"):
        timings.update(_load(source, disk, model, optimizer))
    timings["next"] = start
    return timings


def _copy_seconds(tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> float:
    """One plain memory copy of this rank's state (parameters and Adam moments: the
    bytes a snapshot keeps), into tensors allocated and touched beforehand."""
    sources = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    for moments in optimizer.state.values():
        sources += [v.to_local() if hasattr(v, "to_local") else v for v in moments.values()]
    sources = [s for s in sources if isinstance(s, torch.Tensor) and s.numel() > 1]
    targets = [torch.empty_like(s).fill_(0) for s in sources]
    began = time.perf_counter()
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--kept-with", choices=("none", "snapshot", "dcp"), default="none")
    parser.add_argument("--state-mb", type=float, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--disk", default="")
    parser.add_argument("--disk-step", type=int, default=3)
    args = parser.parse_args()
    out = os.environ["BENCH_OUT"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build(args.state_mb, world, args.mode == "fsdp2")
    start = 0
    if args.kept_with == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from rtrain.core.worker.dcp import SnapshotWriter, restored_step

        if restored_step() is not None:
            timings = restore_timings(args.disk, model, optimizer)
            start = timings.pop("next")
            if rank == 0:
                with open(os.path.join(out, "restore.json"), "w") as handle:
                    json.dump({**timings, "world": world, "step": start - 1}, handle)
    cores = os.environ.get("BENCH_CORES")
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    tensors = [t for t in model.state_dict().values() if isinstance(t, torch.Tensor)]
    inputs = torch.randn(args.batch, 1024)
    times, inside, copies = [], [], []
    for step in range(start, args.steps):
        began = time.perf_counter()
        loss = model(inputs).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        kept = time.perf_counter()
        if args.kept_with == "snapshot":
            snapshot({"model": model, "optim": optimizer}, step)
        elif args.kept_with == "dcp":
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd, "data": {"next": step + 1}}
            dcp.save(state, storage_writer=SnapshotWriter(step))
        inside.append(time.perf_counter() - kept)
        if args.kept_with == "dcp" and args.disk and step == args.disk_step:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(args.disk))
        heartbeat(step)
        times.append(time.perf_counter() - began)
        if rank == 0:
            with open(os.path.join(out, "progress"), "w") as handle:
                handle.write(str(step + 1))
    for _ in range(max(args.steps - start - args.warmup, 1)):
        copies.append(_copy_seconds(tensors, optimizer))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "steps.json"), "w") as handle:
            json.dump(
                {
                    "times": times[args.warmup :],
                    "inside": inside[args.warmup :],
                    "copy": copies,
                    "world": world,
                },
                handle,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
