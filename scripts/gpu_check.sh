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
#    initializes CUDA makes rtrain refuse to fork, with one line and exit 64.
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
LOGLEVEL=INFO timeout 60 $PY -m rtrain.cli.main launch --standalone --nproc-per-node=2 \
    --health-interval 2 examples/train_mlp.py --steps 3000 2>&1 | grep -E "rtrain|GPU|checksum" | tail -n 40 &
RUN=$!
sleep 30
pkill -INT -f "examples/train_mlp.py" 2>/dev/null
wait $RUN
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
echo "== done"
