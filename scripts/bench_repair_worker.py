"""The job scripts/bench_repair.py measures: the same small DDP model with BENCH_STATE_MB of
extra state per rank (a buffer kept and restored with the model), over gloo, written five
ways for the five ways of coming back from a fault:

  disk      torch.save of the state every step, torch.load on start (torchrun, ft_launcher)
  snapshot  rtrain.snapshot() every step, rtrain.restore() on start (rtrain's restart)
  repair    rtrain.repairable: the training function is re-entered in the same process
            (repair in place; the hook for rtrain.core.worker.repair)
  through   rtrain.repairable(train_through=True): the kept rank trains on at once and
            does the failed rank's data share too (rtrain.data_ranks(),
            rtrain.average_gradients(): the global batch is kept); the replacement
            joins at a step boundary once its start-up is done
  torchft   torchft's Manager over its lighthouse: one process per replica group, the
            healthy group keeps stepping while the failed one is gone

Rank 1 (replica group 1 under torchft) injects BENCH_FAULT at the start of step
BENCH_FAULT_STEP, once, after writing $BENCH_OUT/fault.json (t_fault): crash = SIGKILL,
hang = SIGSTOP, none = the marker only (a fault-free run timed the same way). Every
process appends "began ended step world shares" to $BENCH_OUT/steps_<pid>.txt as each
step completes (for torchft: as each step commits; world = the processes or replica
groups that took part, shares = the logical data ranks it did, comma-separated), so the
harness can find the first step begun after the fault and its end (a step under way at
the fault does not count), the first at full size again, and the samples trained.

BENCH_STEP_SLEEP: a share's compute (a GPU's time for one rank's batch), slept after
each step; a worker doing two logical shares (train through's interim) sleeps twice it.

BENCH_STARTUP_S=S: a process started after the first generation (RTRAIN_GENERATION > 0,
TORCHELASTIC_RESTART_COUNT > 0, or BENCH_RESTARTED=1: a torchft replica the harness
restarted), or a warm spare (RTRAIN_SPARE), sleeps S seconds at module level, before
building its model: a GPU process's cold start (CUDA context, NCCL init, model to device,
compile), the same in every launcher.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

OUT = os.environ.get("BENCH_OUT", "")
MODE = os.environ.get("BENCH_MODE", "disk")
STEPS = int(os.environ.get("BENCH_STEPS", "30"))
FAULT_STEP = int(os.environ.get("BENCH_FAULT_STEP", "8"))
PAUSE = float(os.environ.get("BENCH_STEP_SLEEP", "0.05"))
FAULT = os.environ.get("BENCH_FAULT", "crash")
RESTARTED = ("RTRAIN_GENERATION", "TORCHELASTIC_RESTART_COUNT", "BENCH_RESTARTED")
SPARE = "RTRAIN_SPARE" in os.environ  # a warm spare (--spares-per-node): cold too
if SPARE or any(int(os.environ.get(name, "0") or 0) > 0 for name in RESTARTED):
    time.sleep(float(os.environ.get("BENCH_STARTUP_S", "0")))  # a GPU process's cold start
# BENCH_WAIT_SPARE=1: the fault waits (past BENCH_FAULT_STEP) for a spare to be warm
WAIT_SPARE = os.environ.get("BENCH_WAIT_SPARE") == "1"

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.05, momentum=0.9)
EXTRA = torch.ones(int(float(os.environ.get("BENCH_STATE_MB", "100")) * 2**20) // 4)
if SPARE and OUT:  # its start-up done: it parks at the function's entry next
    open(os.path.join(OUT, "spare_warm"), "w").close()


def state() -> dict:
    return {"model": MODEL.state_dict(), "optimizer": OPTIMIZER.state_dict(), "extra": EXTRA}


def load(saved: dict) -> None:
    MODEL.load_state_dict(saved["model"])
    OPTIMIZER.load_state_dict(saved["optimizer"])
    EXTRA.copy_(saved["extra"])


def note_step(step: int, began: float, world: int, shares: tuple[int, ...]) -> None:
    if OUT:
        done = ",".join(str(s) for s in shares)
        with open(os.path.join(OUT, f"steps_{os.getpid()}.txt"), "a") as handle:
            handle.write(f"{began:.6f} {time.time():.6f} {step} {world} {done}\n")


def inject(who: int, step: int) -> None:
    marker = os.path.join(OUT, "fault.json")
    if who != 1 or step < FAULT_STEP or not OUT or os.path.exists(marker):
        return
    if WAIT_SPARE and not os.path.exists(os.path.join(OUT, "spare_warm")):
        return
    with open(marker + ".tmp", "w") as handle:
        handle.write(f'{{"t_fault": {time.time():.6f}, "step": {step}}}')
    os.replace(marker + ".tmp", marker)
    if FAULT != "none":
        os.kill(os.getpid(), signal.SIGSTOP if FAULT == "hang" else signal.SIGKILL)


def batch(step: int, who: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 100 + who))
    return inputs, inputs.sum(dim=1, keepdim=True)


def loop(model: nn.Module, rank: int, start: int, keep: Callable[[int], None]) -> None:
    for step in range(start, STEPS):
        began = time.time()
        inject(rank, step)
        inputs, targets = batch(step, rank)
        OPTIMIZER.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        OPTIMIZER.step()
        keep(step)
        note_step(step, began, dist.get_world_size(), (rank,))
        time.sleep(PAUSE)


def nvrx_heartbeat() -> Callable[[], None]:
    """Under ft_launcher: heartbeats to its rank monitor each step (what its hang
    detection, --ft-rank_heartbeat_timeout, watches); elsewhere nothing."""
    if "FT_RANK_MONITOR_IPC_SOCKET" not in os.environ:
        return lambda: None
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    return client.send_heartbeat


def run_disk() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(OUT, f"ckpt_rank{rank}.pt")
    start = 0
    if os.path.exists(path):
        saved = torch.load(path)
        load(saved)
        start = saved["step"] + 1

    beat = nvrx_heartbeat()

    def keep(step: int) -> None:
        torch.save({**state(), "step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
        beat()

    loop(DDP(MODEL), rank, start, keep)
    dist.barrier()
    dist.destroy_process_group()


def run_snapshot() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rtrain

    dist.init_process_group("gloo")
    restored = rtrain.restore(copy=False)
    start = 0
    if restored is not None:
        load(restored[0])
        start = restored[1] + 1

    def keep(step: int) -> None:
        rtrain.snapshot(state(), step)
        rtrain.heartbeat(step)

    loop(DDP(MODEL), dist.get_rank(), start, keep)
    dist.barrier()
    dist.destroy_process_group()


def run_repair() -> None:
    """Repair in place: H8's rtrain.repairable re-enters train() in the same process on
    the next generation's group; the model, optimizer and buffer live outside it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rtrain

    kept = {"model": MODEL, "optimizer": OPTIMIZER, "extra": EXTRA}

    @rtrain.repairable(backend="gloo")
    def train() -> None:
        restored = rtrain.restore(into=kept)
        start = 0 if restored is None else restored[1] + 1

        def keep(step: int) -> None:
            rtrain.snapshot(kept, step)
            rtrain.heartbeat(step)

        loop(DDP(MODEL), dist.get_rank(), start, keep)
        dist.barrier()

    train()


def through_step(step: int, logical: tuple[int, ...]) -> None:
    """One step over the logical data ranks this worker does: each one's gradient, then
    the mean over every logical rank of the step (the global batch of a fault-free run)."""
    import rtrain

    grads = {}
    for data_rank in logical:
        inputs, targets = batch(step, data_rank)
        OPTIMIZER.zero_grad()
        nn.functional.mse_loss(MODEL(inputs), targets).backward()
        grads[data_rank] = [torch.clone(p.grad) for p in MODEL.parameters() if p.grad is not None]
    rtrain.average_gradients(MODEL.parameters(), grads)
    OPTIMIZER.step()


def run_through() -> None:
    """Train through: the kept rank goes on at once in a group of its own, doing the
    failed rank's share as well; the replacement joins when its start-up is done."""
    import rtrain

    kept = {"model": MODEL, "optimizer": OPTIMIZER, "extra": EXTRA}
    rank = int(os.environ.get("RANK", "0"))

    @rtrain.repairable(backend="gloo", train_through=True)
    def train() -> None:
        restored = rtrain.restore(into=kept)
        start = 0 if restored is None else restored[1] + 1
        for step in range(start, STEPS):
            began = time.time()
            logical = rtrain.data_ranks()  # the step boundary: a warm replacement joins here
            inject(rank, step)
            through_step(step, logical)
            rtrain.snapshot(kept, step)
            rtrain.heartbeat(step)
            note_step(step, began, dist.get_world_size(), logical)
            time.sleep(PAUSE * len(logical))  # a share's compute: two shares take twice it
        dist.barrier()

    train()


def run_torchft() -> None:
    from datetime import timedelta

    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    group = int(os.environ["REPLICA_GROUP_ID"])
    # The replica group's own store (torchrun would host it; one process per group here).
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=True,
        wait_for_workers=False,
    )
    timeout = float(os.environ.get("BENCH_TORCHFT_TIMEOUT_S", "10"))
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=timeout)),
        min_replica_size=1,
        load_state_dict=load,
        state_dict=state,
        replica_id=f"bench_{group}",
        timeout=timedelta(seconds=10),
    )
    model = DistributedDataParallel(manager, MODEL)
    # Both groups' managers heartbeat before either asks for a quorum, so the first quorum
    # holds both (with min_replica_size=1 a lone early group would train on alone).
    ready = os.path.join(OUT, f"ready_{group}")
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(OUT, f"ready_{g}")) for g in (0, 1)):
        if time.monotonic() > deadline:
            raise SystemExit("the other replica group never started")
        time.sleep(0.05)
    while manager.current_step() < STEPS:
        step = manager.current_step()
        began = time.time()
        inject(group, step)
        inputs, targets = batch(step, group)
        manager.start_quorum()
        OPTIMIZER.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        if manager.should_commit():
            OPTIMIZER.step()
            note_step(step, began, manager.num_participants(), (group,))
        time.sleep(PAUSE)
    manager.shutdown()
    del store


if __name__ == "__main__":
    modes: dict[str, Callable[[], None]] = {
        "disk": run_disk,
        "snapshot": run_snapshot,
        "repair": run_repair,
        "through": run_through,
        "torchft": run_torchft,
    }
    modes[MODE]()
