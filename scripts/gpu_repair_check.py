"""Repair in place on a lent GPU: a CUDA tensor and its process survive a repair.

Two workers of tests/scripts/repair_probe.py (rtrain.repairable over gloo; one GPU
cannot hold two NCCL ranks) each make a CUDA tensor once per process; the check plays
the agent through the control files: it SIGKILLs rank 1, asks rank 0 to repair, starts
a new rank 1 in generation 1 and hands rank 0 that generation. Rank 0 must come back
in the same process with the same tensor (address and sum), its CUDA context never
rebuilt. Prints how long the survivor took to park and to its next step.

    python scripts/gpu_repair_check.py            # --device cpu: the same on the CPU
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rtrain.core.contract.repair_files import (  # noqa: E402
    REQUEST_FILE,
    RESUME_FILE,
    Resume,
    encode_request,
    encode_resume,
)
from tests.integration.test_repair_release import Workers, wait_for  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu_repair_") as tmp:
        workers = Workers(Path(tmp), 2, PROBE_KEEP_DEVICE=args.device)
        try:
            port = workers.host_store()
            for rank in range(2):
                workers.start(rank, 0, port)
            wait_for(lambda: all(workers.steps(r) >= 5 for r in range(2)), 120, "no training")
            before = workers.record("enter_gen0_rank0.json")
            workers.procs[1].send_signal(signal.SIGKILL)
            workers.procs[1].wait()
            asked = time.monotonic()
            (workers.folder(0) / REQUEST_FILE).write_bytes(encode_request(0))
            parked = wait_for(lambda: workers.parked(0), 30, "rank 0 never parked")
            port = workers.host_store()
            workers.start(1, 1, port, PROBE_STEPS="20")
            env = {**workers.env(0, 1, port, 2), "PROBE_STEPS": "20"}
            (workers.out / "step_rank0").unlink()  # counts generation 1's steps from here
            resume = Resume(1, workers.procs[0].pid, env)  # addressed to rank 0's process
            (workers.folder(0) / RESUME_FILE).write_bytes(encode_resume(resume))
            wait_for(lambda: workers.steps(0) >= 1, 120, "rank 0 never stepped again")
            stepped = time.monotonic() - asked
            codes = [workers.procs[r].wait(120) for r in range(2)]
            after = workers.record("enter_gen1_rank0.json")
        finally:
            workers.close()
    same = all(before[k] == after[k] for k in ("pid", "kept_ptr", "kept_sum"))
    print(
        f"repair in place ({args.device}): survivor parked {parked:.3f} s after the request, "
        f"next step {stepped:.3f} s after it; exit codes {codes}; pid, tensor address and "
        f"sum {'kept' if same else 'CHANGED'} ({before} -> {after})"
    )
    return 0 if same and codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
