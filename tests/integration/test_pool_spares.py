"""The worker pool's spares (prefork): a worker forked ahead of its spawn, which the spawn
hands its request (repair in place forks the failed worker's replacement at the fault)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rtrain.agent.workers.pool import WorkerExit, WorkerPool

pytestmark = pytest.mark.integration


def _request(worker_id: str, tmp_path: Path, script: str) -> dict[str, object]:
    return {
        "id": worker_id,
        "kind": "exec",
        "target": "sh",
        "args": ["-c", script],
        "env": dict(os.environ),
        "cwd": str(tmp_path),
        "stdout_file": None,
        "stderr_file": None,
    }


def _children(pool: WorkerPool, count: int) -> list[psutil.Process]:
    (zygote,) = pool.pids
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = psutil.Process(zygote).children()
        if len(children) >= count:
            return children
        time.sleep(0.02)
    raise AssertionError(f"the pool forked {len(children)} spares, not {count}")


def _exits(pool: WorkerPool, count: int) -> list[WorkerExit]:
    exits: list[WorkerExit] = []
    deadline = time.monotonic() + 30
    while len(exits) < count and time.monotonic() < deadline:
        exits += pool.poll_exits(0.05)
    return exits


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    """A started pool, its zygote ready, closed after the test."""
    pool = WorkerPool((), dict(os.environ), warm_later=())
    pool.start()
    try:
        pool.wait_ready(30)
        yield pool
    finally:
        pool.close()


def test_a_spawn_takes_the_spare_forked_before_it(tmp_path: Path, pool: WorkerPool) -> None:
    pool.prefork("w0")
    (spare,) = _children(pool, 1)
    forked = spare.create_time()
    asked = time.time()
    pid = pool.spawn(_request("w0", tmp_path, "echo $$ > pid; exit 4"))
    exits = _exits(pool, 1)
    # the spare became the worker: same process, forked before the spawn was asked for
    assert pid == spare.pid == int((tmp_path / "pid").read_text())
    assert forked < asked
    assert [(e.worker_id, e.pid, e.exitcode) for e in exits] == [("w0", pid, 4)]


def test_spares_no_spawn_took_are_dropped_without_an_exit(tmp_path: Path, pool: WorkerPool) -> None:
    pool.prefork("w0")
    pool.prefork("w1")
    spares = _children(pool, 2)
    # w0's spawn takes its spare; w1's spare is dropped after the group's spawns
    pid = pool.spawn(_request("w0", tmp_path, "exit 0"))
    pool.drop_spares()
    psutil.wait_procs([s for s in spares if s.pid != pid], timeout=30)
    exits = _exits(pool, 1)
    exits += pool.poll_exits(0.5)  # a dropped spare's exit would come by now
    left = [p.pid for p in psutil.Process(pool.pids[0]).children()]
    assert pid in [s.pid for s in spares]
    assert [(e.worker_id, e.exitcode) for e in exits] == [("w0", 0)]
    assert left == []


def test_a_spare_killed_while_it_waits_is_replaced_by_a_fresh_fork(
    tmp_path: Path, pool: WorkerPool
) -> None:
    pool.prefork("w0")
    (spare,) = _children(pool, 1)
    spare.kill()
    spare.wait(30)
    pid = pool.spawn(_request("w0", tmp_path, "echo $$ > pid; exit 3"))
    exits = _exits(pool, 1)
    exits += pool.poll_exits(0.5)  # the dead spare's exit would come by now
    assert pid != spare.pid and pid == int((tmp_path / "pid").read_text())
    assert [(e.worker_id, e.pid, e.exitcode) for e in exits] == [("w0", pid, 3)]


def test_a_standby_pool_warms_up_at_once_then_forks_its_spares(tmp_path: Path) -> None:
    # the warm-up's module takes a second to import and says when it finished; an idle
    # pool would not start it before a minute of quiet
    (tmp_path / "slow_warm.py").write_text(
        "import time\ntime.sleep(1)\nopen(__file__ + '.done', 'w').close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    pool = WorkerPool((), env, warm_later=("slow_warm",), warm_after=60.0)
    pool.start()
    try:
        pool.wait_ready(30)
        asked = time.time()
        pool.standby(["w0", "w1"])
        spares = _children(pool, 2)
        warm_before_fork = (tmp_path / "slow_warm.py.done").exists()
        pid = pool.spawn(_request("w0", tmp_path, "exit 0"))
        pool.drop_spares()
        exits = _exits(pool, 1)
    finally:
        pool.close()
    # warmed up at once (not after a minute of quiet), and only then the spares forked
    # (a fork must not cut into an import); the spawn took its spare
    assert warm_before_fork
    assert (tmp_path / "slow_warm.py.done").stat().st_mtime < asked + 30
    assert pid in [s.pid for s in spares]
    assert [(e.worker_id, e.exitcode) for e in exits] == [("w0", 0)]
