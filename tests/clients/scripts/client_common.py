"""What every real-client script shares: a digest of the final weights, one result file
per rank, and a crash injected at a chosen step of the first attempt only.

The scripts run under torchrun and under rtrain alike and know nothing of rtrain.
Environment: CLIENT_CRASH_STEP and CLIENT_CRASH_RANK (default 1) make that rank exit
with os._exit(3) at that step while TORCHELASTIC_RESTART_COUNT is 0.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import resource
import time
from collections.abc import Mapping
from typing import Any

import torch

STARTED = time.monotonic()
_training_started: float | None = None
_step_ends: list[float] = []
_usage_at_start: tuple[float, int, int] = (0.0, 0, 0)


def _usage() -> tuple[float, int, int]:
    """This process's CPU seconds, minor and major page faults so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt, usage.ru_majflt


def training_started() -> None:
    """Mark the first training step: steps/s counts from here (not start-up)."""
    global _training_started, _usage_at_start
    if _training_started is None:
        _usage_at_start = _usage()
        _training_started = time.monotonic()


def step_done() -> None:
    """Mark the end of a training step: the result lists each step's seconds."""
    _step_ends.append(time.monotonic())


def step_seconds() -> list[float]:
    """Each marked step's duration (the first counted from training_started)."""
    if _training_started is None:
        return []
    ends = [_training_started, *_step_ends]
    return [round(b - a, 6) for a, b in itertools.pairwise(ends)]


def weights_digest(state: Mapping[str, Any]) -> str:
    """sha256 over the tensors of a (flat) state dict, in key order."""
    digest = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        if isinstance(value, torch.Tensor):
            digest.update(key.encode())
            digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def write_result(out: str, steps: int, **fields: Any) -> None:
    now = time.monotonic()
    cpu, minor, major = (b - a for a, b in zip(_usage_at_start, _usage(), strict=True))
    training = now - (_training_started if _training_started is not None else STARTED)
    rank = int(os.environ.get("RANK", "0"))
    record = {
        "rank": rank,
        "steps": steps,
        "wall_s": now - STARTED,
        "train_s": training,
        "steps_per_s": steps / training if training > 0 else None,
        "step_s": step_seconds(),
        "training_started": _training_started,  # time.monotonic(): the machine's clock
        "train_cpu_s": cpu,  # CPU seconds and page faults from training_started on
        "train_minor_faults": minor,
        "train_major_faults": major,
        **fields,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"result_rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


def maybe_crash(step: int) -> None:
    """Exit 3 at CLIENT_CRASH_STEP on CLIENT_CRASH_RANK, in the first attempt only."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if os.environ.get("CLIENT_CRASH_STEP") != str(step):
        return
    if os.environ.get("RANK") == os.environ.get("CLIENT_CRASH_RANK", "1"):
        print(f"client: crashing at step {step} as asked", flush=True)
        os._exit(3)


def synthetic_regression(samples: int, features: int, seed: int = 0) -> torch.utils.data.Dataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator) + 0.1 * torch.randn(samples, 1)
    return torch.utils.data.TensorDataset(x, y)


BATCH = 16


def regression_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.utils.data.TensorDataset,
    step: int,
    rank: int,
    world: int,
) -> torch.Tensor:
    """One step on this rank's slice of the global batch of `step`; the loss."""
    x, y = data[torch.arange(BATCH) + (step * world + rank) * BATCH]
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss
