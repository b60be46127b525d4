"""The time inside snapshot() (or dcp.save into rtrain's memory) against a plain copy of
the same tensors, in CPU seconds, with what the difference is made of.

A model of nn.Linear(width, width) layers and Adam's moments, --mb of state in all. Each
repetition runs, one after the other (interleaved, so a loaded machine slows all alike):

  copy       the baseline: copy_ of each tensor snapshot() copies (parameters, both
             moments and Adam's 1-element step tensors) into views of one anonymous
             buffer laid out as the slot is, allocated and touched beforehand
  copy shm   the same into a /dev/shm mapping (the slot's kind of memory: no huge
             pages there, and none on anonymous memory unless THP is "always")
  memcpy     one copy of the same bytes, buffer to buffer (the floor: no per-tensor cost)
  snapshot() into a slot in /dev/shm (the agent's part, the replicated mark, done at
             once), split into: state_dict() of the Stateful objects (the caller's
             model and optimizer), the layout (the signature walk that reuses the last
             skeleton), the write (the copy), and the rest (choosing the slot, headers)
  dcp.save   with --dcp, instead of snapshot(): dcp.save(model and optimizer state dicts,
             storage_writer=SnapshotWriter(step)), split into the snapshot() inside it,
             the rest of SnapshotWriter (its index of the save, the items, the results)
             and DCP's own part (flattening the state dict, planning, resolving items)

CPU time of this thread, not wall time: on a shared machine the wall time of either
moves by more than their difference. Medians of --reps; minor page faults a call.

    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 100 --width 1024
    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 100 --width 128
    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 1024 --width 1024 --reps 7
    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 100 --width 1024 --dcp
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import rtrain.core.worker.snapshots as api
from rtrain.core.snapshots.format import ALIGN, set_replicated
from rtrain.core.worker.dcp import storage as dcp_storage

PARTS = ("state_dict", "layout", "write")


def _timed(parts: dict[str, float], name: str, function: Callable[..., Any]) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            parts[name] += time.thread_time() - began

    return timed


def _views(buffer: Any, sources: list[torch.Tensor]) -> list[torch.Tensor]:
    views, offset = [], 0
    for source in sources:
        nbytes = source.numel() * source.element_size()
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        views.append(raw.view(source.dtype).view(source.shape).fill_(0))
        offset += -(-nbytes // ALIGN) * ALIGN
    return views


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _thp() -> str:
    found = []
    for name in ("enabled", "shmem_enabled"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as handle:
                found.append(f"{name} {handle.read().split('[')[1].split(']')[0]}")
        except (OSError, IndexError):
            found.append(f"{name} unknown")
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024, help="smaller: more tensors")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--dcp", action="store_true", help="dcp.save instead of snapshot()")
    parser.add_argument(
        "--plan-cache", action="store_true", help="dcp.save with DCP's plan caching"
    )
    parser.add_argument(
        "--lean", action="store_true", help="no /dev/shm copy or memcpy (one state's less memory)"
    )
    parser.add_argument(
        "--changing",
        action="store_true",
        help="plain values that change each step, as in training: a learning-rate "
        "scheduler stepped before each save and the step count in the state",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() before timing: the collector no longer walks the long-lived heap",
    )
    args = parser.parse_args()
    layers = max(int(args.mb * 2**20 / 4 / 3) // (args.width * args.width), 1)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, args.width)).sum().backward()
    optimizer.step()
    state: dict[str, Any] = {"model": model, "optim": optimizer}
    with warnings.catch_warnings():  # its step() before the optimizer's: on purpose
        warnings.simplefilter("ignore")
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 1000)
    sources = [p.detach() for p in model.parameters()]
    sources += [v for s in optimizer.state.values() for v in s.values()]
    size = sum(-(-s.numel() * s.element_size() // ALIGN) * ALIGN for s in sources)
    anonymous = bytearray(size)
    anonymous_views = _views(anonymous, sources)
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    shared_views: list[torch.Tensor] = []
    flat_from: torch.Tensor | None = None
    if not args.lean:
        fd = os.open(os.path.join(folder, "baseline"), os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, size)
        shared = mmap.mmap(fd, size)
        os.close(fd)
        shared_views = _views(shared, sources)
        flat_from = torch.frombuffer(shared, dtype=torch.uint8)
    flat_to = torch.frombuffer(anonymous, dtype=torch.uint8)
    os.environ[api.SNAPSHOT_DIR], os.environ["RANK"] = folder, "0"
    parts = dict.fromkeys(PARTS, 0.0)
    api.state_of = _timed(parts, "state_dict", api.state_of)  # type: ignore[assignment]
    api.plan_shard = _timed(parts, "layout", api.plan_shard)  # type: ignore[assignment]
    api.write_shard = _timed(parts, "write", api.write_shard)  # type: ignore[assignment]
    inside_dcp = {"snapshot": 0.0, "writer": 0.0}
    writer_class = dcp_storage.SnapshotWriter
    for method in ("prepare_global_plan", "write_data"):
        setattr(writer_class, method, _timed(inside_dcp, "writer", getattr(writer_class, method)))
    dcp_storage.snapshot = _timed(  # type: ignore[assignment]
        inside_dcp, "snapshot", dcp_storage.snapshot
    )
    step = 0

    def mark_replicated() -> None:
        slots = api._my_slots()
        newest = None if slots is None else slots.newest()
        assert newest is not None and newest.map is not None
        set_replicated(newest.map, step)

    def copy(targets: list[torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                for target, source in zip(targets, sources, strict=True):
                    target.copy_(source)

        return run

    def memcpy() -> None:
        assert flat_from is not None
        flat_to.copy_(flat_from)

    def changing() -> None:
        if args.changing:  # the training's work, outside the timed call
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scheduler.step()
            state["step"] = step

    def snap() -> None:
        nonlocal step
        api.snapshot(state, step)
        mark_replicated()
        step += 1

    def dcp_save() -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultSavePlanner

        nonlocal step
        dicts = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        if args.changing:
            dicts["step"] = step
        planner = DefaultSavePlanner(enable_plan_caching=True) if args.plan_cache else None
        dcp.save(dicts, storage_writer=dcp_storage.SnapshotWriter(step), planner=planner)
        mark_replicated()
        step += 1

    runs: dict[str, Callable[[], None]] = {"copy": copy(anonymous_views)}
    if not args.lean:
        runs.update({"copy shm": copy(shared_views), "memcpy": memcpy})
    # One or the other: their states differ, so taking turns in the same slots would
    # lay each out afresh every time.
    if args.dcp:
        runs["dcp.save"] = dcp_save
    else:
        runs["snapshot()"] = snap
    named = [*runs, *PARTS, "dcp snapshot()", "dcp writer"]
    times: dict[str, list[float]] = {name: [] for name in named}
    faults: dict[str, list[int]] = {name: [] for name in runs}
    try:
        for _ in range(3):  # every slot written once: its pages are mapped
            for run in runs.values():
                run()
        if args.gc_freeze:
            gc.freeze()  # what a training script can do once its model is built
        for _ in range(args.reps):
            for name, run in runs.items():
                for part in parts:
                    parts[part] = 0.0
                inside_dcp["snapshot"] = inside_dcp["writer"] = 0.0
                if name in ("snapshot()", "dcp.save"):
                    changing()
                before, began = _faults(), time.thread_time()
                run()
                times[name].append(time.thread_time() - began)
                faults[name].append(_faults() - before)
                if name == "snapshot()":
                    for part, spent in parts.items():
                        times[part].append(spent)
                if name == "dcp.save":
                    times["dcp snapshot()"].append(inside_dcp["snapshot"])
                    times["dcp writer"].append(inside_dcp["writer"] - inside_dcp["snapshot"])
    finally:
        shutil.rmtree(folder)  # the mappings go with the process

    def ms(name: str) -> float:
        return statistics.median(times[name]) * 1e3

    base = ms("copy")
    nbytes = sum(s.numel() * s.element_size() for s in sources)
    print(
        f"{nbytes / 2**20:.0f} MiB in {len(sources)} tensors, {args.reps} repetitions, "
        f"medians of CPU ms; THP: {_thp()}; load: {os.getloadavg()[0]:.2f}"
        f"{'; gc.freeze()' if args.gc_freeze else ''}"
        f"{'; a scheduler and the step count change each step' if args.changing else ''}"
    )
    for name in runs:
        print(
            f"  {name:10s} {ms(name):8.2f} ms  {ms(name) / base:5.2f}x copy"
            f"  minor faults {statistics.median(faults[name]):.0f}"
        )
        if name == "snapshot()":
            rest = ms(name) - sum(ms(part) for part in PARTS)
            for part in PARTS:
                print(f"    {part:10s} {ms(part):8.2f} ms")
            print(f"    {'rest':10s} {rest:8.2f} ms")
            without = ms(name) - ms("state_dict")
            print(
                f"    without the caller's state_dict(): {without:.2f} ms, "
                f"{without / base:.2f}x copy (target <= 1.2)"
            )
        if name == "dcp.save":
            inner, writer = ms("dcp snapshot()"), ms("dcp writer")
            print(f"    snapshot() inside  {inner:8.2f} ms")
            print(f"    SnapshotWriter's   {writer:8.2f} ms (its index, items, results)")
            print(f"    DCP's own          {ms(name) - inner - writer:8.2f} ms (planning)")


if __name__ == "__main__":
    main()
