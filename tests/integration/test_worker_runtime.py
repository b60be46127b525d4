"""A worker's runtime is torchrun's: torch's thread counts (OMP_NUM_THREADS is read at
import, and the pool imported torch already) and the script's namespace, which stays
alive until the worker leaves (freeing a DDP model early deadlocks gloo at exit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, RTRAIN, probe_env, run, run_torchrun

pytestmark = pytest.mark.integration

PROBE = str(ROOT / "tests" / "scripts" / "runtime_probe.py")


def _records(out: Path) -> dict[int, dict]:
    return {
        int(p.stem.removeprefix("runtime_rank")): json.loads(p.read_text())
        for p in out.glob("runtime_rank*.json")
    }


def _both(tmp_path: Path, nproc: int, **env: str) -> tuple[dict, dict]:
    found = []
    for name in ("torchrun", "rtrain"):
        out = tmp_path / name
        out.mkdir()
        args = ["--standalone", f"--nproc-per-node={nproc}", PROBE]
        penv = probe_env(out, **env)
        result = run_torchrun(args, penv) if name == "torchrun" else run([*RTRAIN, *args], penv)
        assert result.returncode == 0, result.stderr[-3000:]
        found.append(_records(out))
    return found[0], found[1]


@pytest.mark.parametrize(
    ("nproc", "env"),
    [(2, {}), (2, {"OMP_NUM_THREADS": "2"}), (1, {})],
    ids=["two-workers-omp-unset", "two-workers-omp-2", "one-worker"],
)
def test_thread_counts_are_torchruns(tmp_path: Path, nproc: int, env: dict) -> None:
    oracle, ours = _both(tmp_path, nproc, **env)
    assert sorted(ours) == sorted(oracle) == list(range(nproc))
    for rank in oracle:
        for key in ("omp_num_threads", "num_threads", "num_interop_threads"):
            assert ours[rank][key] == oracle[rank][key], (key, ours[rank], oracle[rank])
    if nproc == 2 and not env:
        assert ours[0]["num_threads"] == 1


def test_the_scripts_namespace_lives_until_the_worker_leaves(tmp_path: Path) -> None:
    oracle, ours = _both(tmp_path, 2)
    for rank in (0, 1):
        assert oracle[rank]["globals_alive_at_exit"] is True
        assert ours[rank]["globals_alive_at_exit"] is True
        for key in ("main_is_script_at_exit", "file_defined_at_exit"):
            assert ours[rank][key] == oracle[rank][key], (key, ours[rank], oracle[rank])
