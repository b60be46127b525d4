"""A training script for rtrain's integration tests and benchmarks.

It records what it saw (environment, timings, steps) to $PROBE_OUT/gen<G>_rank<R>.json
and injects faults on request, torchft-style: PROBE_FAULT="rank=1,step=2,gen=0,action=exit"
fails global rank 1 at step 2 of generation 0 (gen=0/1/2 fails it in each of those).
Actions: exit (code 3), raise, kill (SIGKILL itself), hang (sleep forever), stop
(SIGSTOP itself). PROBE_IGNORE_SIGTERM=1 makes the script ignore SIGTERM.
"""

import json
import os
import signal
import sys
import time

T_START = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_fault() -> dict[str, str]:
    text = os.environ.get("PROBE_FAULT", "")
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "3"))
    out = os.environ.get("PROBE_OUT")
    rank = int(os.environ["RANK"])
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fault = parse_fault()
    fault_gens = {int(g) for g in fault.get("gen", "0").split("/")}
    if os.environ.get("PROBE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record = {
        "argv": sys.argv,
        "env": {k: v for k, v in os.environ.items()},
        "pid": os.getpid(),
        "t_start": T_START,
    }
    dist.init_process_group("gloo")
    record["t_init"] = time.time()
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    record["t_first_collective"] = time.time()
    record["first_sum"] = tensor.item()
    done = 0
    for step in range(steps):
        if (
            fault
            and int(fault.get("rank", -1)) == rank
            and int(fault.get("step", -1)) == step
            and generation in fault_gens
        ):
            action = fault.get("action", "exit")
            if out:
                info = {"steps": done, "fault": action, "t_fault": time.time()}
                _write(out, generation, rank, {**record, **info})
            if action == "exit":
                sys.exit(3)
            if action == "raise":
                raise RuntimeError(f"injected failure at step {step}")
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if action == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if action == "hang":
                while True:
                    time.sleep(1)
        t = torch.full((1,), float(step))
        dist.all_reduce(t)
        done += 1
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0")))
    record["steps"] = done
    record["t_end"] = time.time()
    dist.destroy_process_group()
    if out:
        _write(out, generation, rank, record)
    print(f"probe rank {rank} generation {generation} finished {done} steps", flush=True)


def _write(out: str, generation: int, rank: int, record: dict) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"gen{generation}_rank{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
