#!/usr/bin/env bash
# GPU check: run rtrain's NVML code against a real GPU, for the occasions when a
# machine with one is lent. Prints everything; record the output in docs/benchmarks.md.
#
#   scripts/gpu_check.sh            # from the repository root, rtrain installed
#
# 1. the driver as nvidia-smi sees it (when present);
# 2. `rtrain health --json` and the table against the real NVML, with their exit codes;
# 3. the agent's sampler: every check on every GPU, timed (real driver calls);
# 4. a 30-second monitored run: `rtrain launch` with --health-interval 2 on a small CPU
#    job, so that the agent's NVML monitor and XID listener run beside training;
# 5. CUDA and NCCL in workers forked from the pool, before and after a restart (the
#    second generation is forked after the pool warmed torch._dynamo);
# 6. CUDA stays uninitialized in the pool: a --preload module that asks
#    torch.cuda.is_available() (answered by NVML: the pool runs with
#    PYTORCH_NVML_BASED_CUDA_CHECK=1) leaves forked workers a working CUDA, and one that
#    initializes CUDA makes rtrain refuse to fork, with one line and exit 64;
# 7. snapshot D2H: GB/s into a page-locked (registered) slot against a pageable one,
#    how much of the copy hides behind compute, snapshot()/restore() of CUDA tensors.
# 8. repair in place: a CUDA tensor and its process survive a repair (rtrain.repairable;
#    scripts/gpu_repair_check.py).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
unset RTRAIN_FAKE_NVML

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,temperature.gpu,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
else
    echo "(no nvidia-smi)"
fi

echo "== rtrain health --json"
time $PY -m rtrain.cli.main health --json
echo "exit code: $?"

echo "== rtrain health"
$PY -m rtrain.cli.main health --xid-wait 2
echo "exit code: $?"

echo "== sampling cost against the real NVML"
$PY - <<'PY'
import statistics, time
from rtrain.agent.health.gpu_monitor import GpuMonitor
from rtrain.agent.health.nvml_reader import open_nvml
from rtrain.core.health.gpu_health import Thresholds
nvml = open_nvml()
print("driver", nvml.nvmlSystemGetDriverVersion(), "GPUs", nvml.nvmlDeviceGetCount())
monitor = GpuMonitor(nvml, Thresholds(), None, 10.0)
times = []
for _ in range(20):
    t = time.perf_counter(); report = monitor.check(); times.append(time.perf_counter() - t)
monitor.close()
print(f"every check on {report.found} GPUs: median {statistics.median(times) * 1e3:.2f} ms, "
      f"max {max(times) * 1e3:.2f} ms; verdict {report.verdict.label}")
for gpu in report.gpus:
    print(gpu.index, gpu.name, gpu.uuid, [(c.check, c.verdict.label, c.reading) for c in gpu.checks])
PY

echo "== 30-second monitored run"
# SIGINT to the launcher it started after 30 s (rtrain forwards it to its workers), and
# SIGKILL 30 s later if it is still there: only this run is ended.
LOGLEVEL=INFO timeout --signal=INT --kill-after=30 30 $PY -m rtrain.cli.main launch \
    --standalone --nproc-per-node=2 --health-interval 2 examples/train_mlp.py --steps 3000 \
    2>&1 | grep -E "rtrain|GPU|checksum" | tail -n 40
echo "== CUDA in forked workers (a crash, then a restart)"
timeout 120 $PY -m rtrain.cli.main launch --standalone --nproc-per-node=1 --max-restarts=1 \
    tests/scripts/cuda_fork_probe.py 2>&1 | grep -E "cuda ok|rtrain:|Error|error" | tail -n 20
echo "exit code: ${PIPESTATUS[0]}"
echo "== CUDA left uninitialized by a preload that asks torch.cuda.is_available()"
PYTHONPATH="tests/scripts${PYTHONPATH:+:$PYTHONPATH}" timeout 120 $PY -m rtrain.cli.main launch \
    --standalone --nproc-per-node=1 --max-restarts=1 --preload torch,cuda_preload_probe \
    tests/scripts/cuda_fork_probe.py 2>&1 | grep -E "preload:|cuda ok|rtrain:|Error|error" | tail -n 20
echo "exit code: ${PIPESTATUS[0]} (expect 0, initialized=False, two 'cuda ok')"
echo "== a pool whose preload initialized CUDA refuses to fork"
RTRAIN_PROBE_INIT_CUDA=1 PYTHONPATH="tests/scripts${PYTHONPATH:+:$PYTHONPATH}" timeout 120 \
    $PY -m rtrain.cli.main launch --standalone --nproc-per-node=1 \
    --preload torch,cuda_preload_probe tests/scripts/cuda_fork_probe.py 2>&1 | tail -n 5
echo "exit code: ${PIPESTATUS[0]} (expect 64 and 'CUDA is initialized in the worker pool')"
echo "== snapshot D2H: device tensors into page-locked slot memory on a side stream"
timeout 300 $PY - <<'PY'
# core/worker/device_copy.py: the slot is registered once (cudaHostRegister), copies go
# on a side stream, finished before the commit. Prints D2H GB/s (registered slot vs a
# pageable one), how much of the copy hides behind compute on the training stream, and
# a snapshot()/restore() round trip of CUDA tensors through a real slot, bitwise.
import mmap, os, tempfile, time, torch
from rtrain.core.worker.device_copy import DeviceCopier
assert torch.cuda.is_available(), "no CUDA"
n = 1 << 30
src = torch.randn(n // 4, device="cuda")
fd, path = tempfile.mkstemp(dir="/dev/shm")
os.posix_fallocate(fd, 0, n); buf = mmap.mmap(fd, n); os.close(fd)
dst = torch.frombuffer(buf, dtype=torch.uint8, count=n)
dst.fill_(0)  # fault the pages in, as a slot written once before
def d2h(copier):
    torch.cuda.synchronize(); t = time.perf_counter()
    copier.copy(dst, src.view(torch.uint8)); copier.finish()
    return time.perf_counter() - t
pageable = DeviceCopier()  # no mapping given: not registered
pageable_s = min(d2h(pageable) for _ in range(3))
pinned = DeviceCopier(); pinned.mapping = (buf, n)
pinned_s = min(d2h(pinned) for _ in range(3))
print(f"D2H 1 GiB: pageable {n / pageable_s / 1e9:.1f} GB/s, registered slot {n / pinned_s / 1e9:.1f} GB/s")
a = torch.randn(8192, 8192, device="cuda")
def compute(k=20):
    for _ in range(k): a @ a
def timed(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
    return time.perf_counter() - t
timed(compute)
c = min(timed(compute) for _ in range(3))
def copy_only():
    pinned.copy(dst, src.view(torch.uint8)); pinned.finish()
x = min(timed(copy_only) for _ in range(3))
def both():
    pinned.copy(dst, src.view(torch.uint8)); compute(); pinned.finish()
b = min(timed(both) for _ in range(3))
hidden = (c + x - b) / min(c, x)
print(f"compute {c * 1e3:.1f} ms, copy {x * 1e3:.1f} ms, together {b * 1e3:.1f} ms: {hidden:.0%} of the shorter hidden (100% = full overlap)")
pinned.unregister(buf); del dst; buf.close(); os.remove(path)
import rtrain.core.worker.snapshots as api
with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
    os.environ[api.SNAPSHOT_DIR], os.environ["RANK"] = folder, "0"
    state = {"w": torch.randn(64 << 20, device="cuda"), "b": torch.arange(10, device="cuda"), "step": 3}
    times = []
    for step in range(4):
        torch.cuda.synchronize(); t = time.perf_counter()
        api.snapshot(state, step); times.append(time.perf_counter() - t)
        newest = api._my_slots().newest()
        from rtrain.core.snapshots.format import set_replicated
        set_replicated(newest.map, step)
    got, step = api.restore()
    ok = torch.equal(got["w"], state["w"].cpu()) and torch.equal(got["b"], state["b"].cpu())
    copies = sum(s.copier.device_copies for s in api._my_slots().slots)
    print(f"snapshot() of 256 MiB of CUDA tensors: best {min(times[1:]) * 1e3:.1f} ms "
          f"({256 * 2**20 / min(times[1:]) / 1e9:.1f} GB/s); side-stream copies {copies}; "
          f"restored step {step}, bitwise {'equal' if ok else 'DIFFERENT'}")
PY
echo "exit code: $?"

echo "== repair in place: a CUDA tensor and its process survive a repair"
$PY scripts/gpu_repair_check.py --device cuda
echo "exit code: $?"
echo "== done"
