"""What the probe scripts write for their tests to read: a JSON record put whole (a
temporary file renamed over it), a digest of a model's parameters and optimizer
state (bitwise: two runs match only if every bit does), and the process's resources."""

import hashlib
import json
import os

import torch


def write(out: str, name: str, record: dict) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name + ".tmp"), "w") as handle:
            json.dump(record, handle)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key in sorted(state):
            value = state[key]
            h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def usage() -> dict:
    """This process's resources now: descriptors, threads, resident KiB, mappings of
    shared memory, process groups torch holds."""
    from torch.distributed import distributed_c10d

    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status.read().splitlines())
    with open("/proc/self/maps") as maps:
        shm = sum("/dev/shm/" in line for line in maps)
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(fields["Threads"]),
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "shm_maps": shm,
        "groups": len(distributed_c10d._world.pg_map),
    }
