"""Two repairable gloo workers for tests/integration/test_repair_release_race.py: rank 0
broadcasts a large tensor to rank 1, which the test stops (SIGSTOP) while the bytes are
on their way, so that rank 0 waits in the middle of a send, with part of it queued in
gloo's own transmit queue (not the socket's), when the agent's request comes.

Writes $PROBE_OUT/entering_rank<R> as it enters the broadcast and
$PROBE_OUT/sent_rank<R> once the broadcast returned.
PROBE_GROUP_TIMEOUT: the group's timeout in seconds (120).
"""

import os

import torch
import torch.distributed as dist

import rtrain

OUT = os.environ["PROBE_OUT"]
NUMEL = 1 << 26  # 256 MiB of float32: on the loopback, 0.05-0.3 s on its way


def mark(name: str) -> None:
    with open(os.path.join(OUT, name), "w"):
        pass


@rtrain.repairable(backend="gloo", timeout_s=float(os.environ.get("PROBE_GROUP_TIMEOUT", "120")))
def train() -> None:
    rank = dist.get_rank()
    # Rank 1's pages are touched only as the bytes arrive: its resident size says that
    # the transfer began.
    tensor = torch.ones(NUMEL) if rank == 0 else torch.empty(NUMEL)
    dist.barrier()
    mark(f"entering_rank{rank}")
    dist.broadcast(tensor, 0)
    mark(f"sent_rank{rank}")


if __name__ == "__main__":
    train()
