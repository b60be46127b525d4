"""On a GPU: a --preload module that asks torch.cuda.is_available() in the worker pool
(scripts/gpu_check.sh). The pool runs with PYTORCH_NVML_BASED_CUDA_CHECK=1, so the
question goes to NVML and CUDA stays uninitialized: forked workers can still use it.
With RTRAIN_PROBE_INIT_CUDA=1 it initializes CUDA, and the pool must refuse to fork.
"""

import os

import torch

print(
    f"preload: is_available={torch.cuda.is_available()} "
    f"initialized={torch.cuda.is_initialized()} "
    f"PYTORCH_NVML_BASED_CUDA_CHECK={os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')}",
    flush=True,
)
if os.environ.get("RTRAIN_PROBE_INIT_CUDA"):
    torch.cuda.init()
