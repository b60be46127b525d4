"""The worker pool (zygote) reports a worker's exit when it happens, even while busy."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from rtrain.agent.workers.pool import WorkerExit, WorkerPool

pytestmark = pytest.mark.integration

IMPORT_S = 5.0  # how long the pool's idle-time import takes


def test_an_exit_is_reported_while_the_pool_imports_for_later_restarts(tmp_path: Path) -> None:
    # The pool imports torch._dynamo once idle; a worker that failed meanwhile used to be
    # reaped only after the import, later than its agent's stop, and so was taken for a
    # worker the agent had stopped: its failure was charged to a victim on another node.
    (tmp_path / "slow_to_import.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(tmp_path)!r}, 'import_started').write_text(repr(time.time()))\n"
        f"time.sleep({IMPORT_S})\n"
        f"pathlib.Path({str(tmp_path)!r}, 'import_done').write_text(repr(time.time()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *_pythonpath()])}
    pool = WorkerPool((), env, warm_later=("slow_to_import",))
    pool.start()
    try:
        pool.wait_ready(30)
        pool.spawn(
            {
                "id": "w0",
                "kind": "exec",
                "target": "sh",
                # fails once the pool is busy importing
                "args": ["-c", "while [ ! -e import_started ]; do sleep 0.05; done; exit 3"],
                "env": env,
                "cwd": str(tmp_path),
                "stdout_file": None,
                "stderr_file": None,
            }
        )
        exits: list[WorkerExit] = []
        deadline = time.monotonic() + 3 * IMPORT_S
        while not exits and time.monotonic() < deadline:
            exits = pool.poll_exits(0.05)
        received = time.time()
        while not (tmp_path / "import_done").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        pool.close()
    assert [(e.worker_id, e.exitcode) for e in exits] == [("w0", 3)]
    started = float((tmp_path / "import_started").read_text())
    done = float((tmp_path / "import_done").read_text())
    # the worker failed while the pool was importing, and the agent heard of it then
    assert started < exits[0].time < done
    assert received < done


def _pythonpath() -> list[str]:
    value = os.environ.get("PYTHONPATH", "")
    return [p for p in value.split(os.pathsep) if p]
