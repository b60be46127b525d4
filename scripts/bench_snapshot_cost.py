"""The time inside snapshot() against a plain copy of the same tensors, in CPU seconds.

A model of nn.Linear(width, width) layers and Adam's moments, --mb of state in all; each
repetition copies the state's tensors into tensors allocated and touched beforehand, then
takes a snapshot() into a slot in /dev/shm (the agent's part, the replicated mark, done
at once). CPU time of this thread, not wall time: on a shared machine the wall time of
either moves by more than their difference; the minimum of --reps.

    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 100 --width 1024
    OMP_NUM_THREADS=1 python scripts/bench_snapshot_cost.py --mb 100 --width 128
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import rtrain.core.worker.snapshots as api
import torch
from rtrain.core.snapshots.format import set_replicated
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024, help="smaller: more tensors")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    layers = max(int(args.mb * 2**20 / 4 / 3) // (args.width * args.width), 1)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, args.width)).sum().backward()
    optimizer.step()
    state = {"model": model, "optim": optimizer}
    sources = [p.detach() for p in model.parameters()]
    sources += [v for s in optimizer.state.values() for v in s.values() if v.numel() > 1]
    targets = [torch.empty_like(s).fill_(0) for s in sources]
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ[api.SNAPSHOT_DIR], os.environ["RANK"] = folder, "0"
    step = 0

    def copy() -> None:
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source)

    def snap() -> None:
        nonlocal step
        api.snapshot(state, step)
        slots = api._my_slots()
        newest = None if slots is None else slots.newest()
        assert newest is not None and newest.map is not None
        set_replicated(newest.map, step)
        step += 1

    try:
        for _ in range(3):
            snap()
            copy()
        copies, snaps = [], []
        for _ in range(args.reps):
            began = time.thread_time()
            copy()
            copies.append(time.thread_time() - began)
            began = time.thread_time()
            snap()
            snaps.append(time.thread_time() - began)
    finally:
        shutil.rmtree(folder)
    nbytes = sum(s.numel() * s.element_size() for s in sources)
    print(
        f"{nbytes / 2**20:.0f} MiB in {len(sources)} tensors, CPU seconds: a copy "
        f"{min(copies) * 1e3:.1f} ms, snapshot() {min(snaps) * 1e3:.1f} ms, ratio "
        f"{min(snaps) / min(copies):.2f} (target <= 1.2)"
    )


if __name__ == "__main__":
    main()
