"""A worker's runtime is torchrun's: torch's thread counts (OMP_NUM_THREADS is read at
import, and the pool imported torch already), the script's namespace, which stays
alive until the worker leaves (freeing a DDP model early deadlocks gloo at exit), and
unseeded random draws that differ in every worker, as in fresh interpreters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, RTRAIN, probe_env, records, run, run_torchrun

pytestmark = pytest.mark.integration

PROBE = str(ROOT / "tests" / "scripts" / "runtime_probe.py")
RANDOM_PROBE = str(ROOT / "tests" / "scripts" / "random_probe.py")


def _records(out: Path) -> dict[int, dict]:
    return {
        int(p.stem.removeprefix("runtime_rank")): json.loads(p.read_text())
        for p in out.glob("runtime_rank*.json")
    }


def _both(tmp_path: Path, nproc: int, ours: tuple[str, ...] = (), **env: str) -> tuple[dict, dict]:
    """ours: flags for rtrain alone."""
    found = []
    for name in ("torchrun", "rtrain"):
        out = tmp_path / name
        out.mkdir()
        args = ["--standalone", f"--nproc-per-node={nproc}", PROBE]
        if name == "rtrain":
            args = [*ours, *args]
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


@pytest.mark.parametrize(
    "flags", [("--start-method", "spawn"), ("--preload", "none")], ids=["spawn", "preload-none"]
)
def test_omp_num_threads_set_by_the_script(tmp_path: Path, flags: tuple[str, ...]) -> None:
    # A script that sets OMP_NUM_THREADS=2 before `import torch` got 2 threads under
    # torchrun and 1 in a worker forked from the pool (whose torch read the variable
    # already). --start-method spawn starts each worker as a fresh interpreter;
    # --preload none forks it from a pool that has not imported torch.
    oracle, ours = _both(tmp_path, 2, flags, PROBE_SET_OMP="2")
    assert sorted(ours) == sorted(oracle) == [0, 1]
    for rank in oracle:
        assert oracle[rank]["num_threads"] == 2
        for key in ("omp_num_threads", "num_threads", "num_interop_threads"):
            assert ours[rank][key] == oracle[rank][key], (key, ours[rank], oracle[rank])


def test_unseeded_draws_differ_in_every_worker_as_under_torchrun(tmp_path: Path) -> None:
    # Forks of the pool drew the pool's numbers: the same torch.rand on every rank and in
    # every generation (numpy's too, once the pool had imported numpy.random). Two ranks,
    # a crash, a restart: four workers, each drawing four numbers from each source.
    spreads = []
    for name in ("torchrun", "rtrain"):
        out = tmp_path / name
        out.mkdir()
        args = ["--standalone", "--nproc-per-node=2", "--max-restarts=1", RANDOM_PROBE]
        penv = probe_env(out, PROBE_FAIL_FIRST="1")
        # numpy.random preloaded: the pool holds numpy's global state before every fork
        # (after its warm-up it does anyway: torch._dynamo imports it)
        ours = [*RTRAIN, "--preload", "torch,numpy.random", *args]
        result = run_torchrun(args, penv) if name == "torchrun" else run(ours, penv)
        assert result.returncode == 0, result.stderr[-3000:]
        found = records(out)
        assert sorted(found) == [(0, 0), (0, 1), (1, 0), (1, 1)], name
        spreads.append(
            {
                key: len({tuple(r[key]) for r in found.values()})
                for key in ("torch", "numpy", "random")
            }
        )
    oracle, ours = spreads
    assert oracle == {"torch": 4, "numpy": 4, "random": 4}
    assert ours == oracle
