"""The pool's environment and the import-time variables that decide whether a worker
may be forked from it (pure functions in core/config/worker_env.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from rtrain.agent.workers.group import WorkerGroup, script_sets_import_time
from rtrain.core.config.launch_spec import build_launch_spec
from rtrain.core.config.worker_env import (
    import_time_differences,
    import_time_names_set,
    is_import_time,
    pool_environment,
)


def test_the_pool_gets_omp_num_threads_1_for_several_workers_as_torchrun_sets() -> None:
    assert pool_environment({"PATH": "/bin"}, 2) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert pool_environment({"PATH": "/bin"}, 1) == {"PATH": "/bin"}
    assert pool_environment({"OMP_NUM_THREADS": "4"}, 8) == {"OMP_NUM_THREADS": "4"}


def test_import_time_variables() -> None:
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "MALLOC_ARENA_MAX",
        "LD_PRELOAD",
        "PYTHONHASHSEED",
        "TORCH_LOGS",
        "GLIBC_TUNABLES",
        "TORCHINDUCTOR_CACHE_DIR",
    ):
        assert is_import_time(name), name
    for name in ("RANK", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "MASTER_ADDR", "PATH"):
        assert not is_import_time(name), name


def test_differences_name_only_import_time_variables_that_differ() -> None:
    pool = {"OMP_NUM_THREADS": "1", "PATH": "/bin", "LD_PRELOAD": "x.so"}
    worker = {"OMP_NUM_THREADS": "3", "PATH": "/usr/bin", "RANK": "0", "MKL_NUM_THREADS": "2"}
    assert import_time_differences(pool, worker) == [
        "LD_PRELOAD",
        "MKL_NUM_THREADS",
        "OMP_NUM_THREADS",
    ]
    assert import_time_differences(pool, {**pool, "RANK": "1"}) == []


# A fresh interpreter runs the entry point through rtrain's runner (agent/workers/fresh.py)
RUNNER = ["-u", "-m", "rtrain.agent.workers.fresh"]
T = ["t.py", "--a"]


def _group(kind: str, pool_env: dict[str, str], fresh_workers: bool = False) -> WorkerGroup:
    entry = SimpleNamespace(kind=kind, target="t.py", args=("--a",))
    spec = SimpleNamespace(entrypoint=entry, fresh_workers=fresh_workers)
    return WorkerGroup(SimpleNamespace(env=pool_env), spec, None, "", {}, None)  # type: ignore[arg-type]


def test_a_worker_whose_import_time_settings_differ_runs_as_a_fresh_interpreter() -> None:
    same = _group("script", {"OMP_NUM_THREADS": "1"})._entry({"OMP_NUM_THREADS": "1"})
    assert same == {"kind": "script", "target": "t.py", "args": ["--a"]}
    fresh = _group("script", {"OMP_NUM_THREADS": "1"})._entry({"OMP_NUM_THREADS": "2"})
    assert fresh == {"kind": "exec", "target": sys.executable, "args": [*RUNNER, "script", *T]}
    module = _group("module", {})._entry({"MALLOC_ARENA_MAX": "2"})
    assert module["args"] == [*RUNNER, "module", *T]
    command = _group("exec", {})._entry({"MALLOC_ARENA_MAX": "2"})
    assert command["kind"] == "exec" and command["target"] == "t.py"


def test_start_method_spawn_starts_every_worker_as_a_fresh_interpreter() -> None:
    spawned = _group("script", {}, fresh_workers=True)._entry({})
    assert spawned == {"kind": "exec", "target": sys.executable, "args": [*RUNNER, "script", *T]}
    spec = build_launch_spec({"training_script": "t.py", "start_method": "spawn"})
    assert spec.fresh_workers and spec.preload == ()  # the pool imports nothing for them
    for method in (None, "fork", "forkserver"):
        spec = build_launch_spec({"training_script": "t.py", "start_method": method})
        assert not spec.fresh_workers and spec.preload == ("torch",)


def test_the_import_time_variables_a_script_sets_for_itself_are_found() -> None:
    source = """
import os
os.environ["OMP_NUM_THREADS"] = "2"
os.environ.setdefault("MKL_NUM_THREADS", "2")
os.environ.update({"KMP_AFFINITY": "compact", "MY_OWN": "x"})
os.putenv("MALLOC_ARENA_MAX", "2")
threads = os.environ.get("OPENBLAS_NUM_THREADS")  # read, not set
os.environ["MASTER_PORT"] = "1"  # set, but not read at import
import torch
"""
    found = import_time_names_set(source)
    assert found == ["KMP_AFFINITY", "MALLOC_ARENA_MAX", "MKL_NUM_THREADS", "OMP_NUM_THREADS"]
    assert import_time_names_set("import torch\nprint(torch.get_num_threads())\n") == []
    assert import_time_names_set("def broken(:\n") == []  # the script's own error, later


def test_a_script_that_sets_omp_num_threads_itself_runs_as_a_fresh_interpreter(
    tmp_path: Path,
) -> None:
    script = tmp_path / "t.py"
    script.write_text('import os\nos.environ["OMP_NUM_THREADS"] = "2"\nimport torch\n')
    spec = build_launch_spec({"training_script": str(script), "training_script_args": []})
    group = WorkerGroup(SimpleNamespace(env={}), spec, None, "", {}, None)  # type: ignore[arg-type]
    assert group._entry({})["kind"] == "exec"  # the same environment: the script decides
    script.write_text("import torch\n")
    script_sets_import_time.cache_clear()
    assert group._entry({})["kind"] == "script"
