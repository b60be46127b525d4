"""On a GPU: CUDA and NCCL in a worker forked from rtrain's pool (scripts/gpu_check.sh).

The first attempt exits 3 after its first all-reduce, so the second generation's worker
is forked after the pool has warmed torch._dynamo: CUDA must work in both.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local % torch.cuda.device_count())
x = torch.randn(4096, 4096, device="cuda")
y = (x @ x).sum()
dist.all_reduce(y)
torch.cuda.synchronize()
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
print(f"cuda ok: rank {dist.get_rank()} attempt {attempt} {torch.cuda.get_device_name()}")
if attempt == "0":
    os._exit(3)
dist.destroy_process_group()
