"""Records what a worker's runtime looks like from inside: torch's thread counts, and
whether the script's globals and __main__ are still there when atexit handlers run.
PROBE_SET_OMP=N: the script sets OMP_NUM_THREADS=N itself, before `import torch`.

Writes <PROBE_OUT>/runtime_rank<RANK>.json. Used with torchrun as the oracle.
"""

import atexit
import json
import os
import sys
import weakref

if os.environ.get("PROBE_SET_OMP"):
    os.environ["OMP_NUM_THREADS"] = os.environ["PROBE_SET_OMP"]

import torch  # after the script's own OMP_NUM_THREADS


class Model:  # stands for a DDP model that owns a process group
    pass


model = Model()
model_ref = weakref.ref(model)
record: dict[str, object] = {
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "num_threads": torch.get_num_threads(),
    "num_interop_threads": torch.get_num_interop_threads(),
}


@atexit.register
def at_exit() -> None:
    main = sys.modules.get("__main__")
    record["globals_alive_at_exit"] = model_ref() is not None
    record["main_is_script_at_exit"] = getattr(main, "__dict__", None) is globals()
    record["file_defined_at_exit"] = "__file__" in globals()
    out = os.path.join(os.environ["PROBE_OUT"], f"runtime_rank{os.environ['RANK']}.json")
    with open(out, "w") as handle:
        json.dump(record, handle)
