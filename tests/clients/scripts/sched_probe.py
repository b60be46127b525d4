"""What the scheduler gives a worker, read from inside after gloo is up and a few
collectives ran: nice, policy and CPU affinity of every thread, the session's autogroup
nice, timer slack, resource limits, torch's thread counts and the thread-count variables.

Writes <--out>/sched_rank<RANK>.json. tests/clients/test_worker_settings.py runs it under
torchrun and under rtrain and compares the two.
"""

import argparse
import ctypes
import json
import os
import resource
import threading

import torch
import torch.distributed as dist

PR_GET_TIMERSLACK = 30
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_MEMLOCK", "RLIMIT_CPU")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_PROC_BIND")


def read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def threads() -> list[dict[str, object]]:
    """Each thread's name, nice, policy and affinity (gloo's and torch's included)."""
    found = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        stat = read(f"/proc/self/task/{tid}/stat")
        if stat is None:  # it ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        try:
            policy = os.sched_getscheduler(int(tid))
            affinity = sorted(os.sched_getaffinity(int(tid)))
        except OSError:
            continue
        found.append(
            {
                "comm": read(f"/proc/self/task/{tid}/comm"),
                "nice": int(fields[16]),
                "policy": policy,
                "affinity": affinity,
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    tensor = torch.ones(1024)
    for _ in range(3):
        dist.all_reduce(tensor)
    libc = ctypes.CDLL(None)
    autogroup = read("/proc/self/autogroup")  # "/autogroup-N nice K" where enabled
    record = {
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "policy": os.sched_getscheduler(0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "autogroup_nice": autogroup.split()[-1] if autogroup else None,
        "session_leader": os.getsid(0) == os.getpid(),
        "timer_slack_ns": libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0),
        "oom_score_adj": read("/proc/self/oom_score_adj"),
        "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "variables": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "threads": threads(),
    }
    with open(os.path.join(args.out, f"sched_rank{dist.get_rank()}.json"), "w") as handle:
        json.dump(record, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
