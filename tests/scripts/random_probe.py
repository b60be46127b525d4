"""Records a worker's unseeded draws: torch's default generator, numpy's global state
and `random`'s, as a fresh interpreter seeds them (from the OS's entropy).

Writes <PROBE_OUT>/gen<RESTART>_rank<RANK>.json; with PROBE_FAIL_FIRST set, rank 0 of
the first attempt exits 3 once every rank has drawn, so a restart's workers draw too.
Used with torchrun as the oracle.
"""

import json
import os
import random
import time

import numpy
import torch

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
record = {
    "torch": torch.rand(4).tolist(),
    "numpy": numpy.random.rand(4).tolist(),
    "random": [random.random() for _ in range(4)],
}
out = os.path.join(os.environ["PROBE_OUT"], f"gen{attempt}_rank{os.environ['RANK']}.json")
with open(out, "w") as handle:
    json.dump(record, handle)
if attempt == 0 and os.environ.get("PROBE_FAIL_FIRST") and os.environ["RANK"] == "0":
    world = int(os.environ["WORLD_SIZE"])
    names = [f"gen0_rank{rank}.json" for rank in range(world)]
    deadline = time.monotonic() + 60  # every rank has drawn before the crash
    while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(os.environ["PROBE_OUT"], n)) for n in names
    ):
        time.sleep(0.05)
    os._exit(3)
