"""A worker is shown as torchrun's (`python -u train.py ARGS`, its rank and generation
after it) in ps and /proc/PID/cmdline, and its traceback is the user's alone.

Before, every worker forked from the pool showed the pool's own command line
(`python3 -m rtrain.agent.workers.zygote --fd 6 ...`), and a worker's uncaught
exception was printed with two frames of rtrain's boot code above the script's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtrain.agent.workers.boot import fresh_interpreter
from rtrain.agent.workers.pool import WorkerExit, WorkerPool
from tests.integration.helpers import RTRAIN, probe_env, run

pytestmark = pytest.mark.integration

BOOT_FILES = ("boot.py", "fresh.py", "zygote.py", "spare.py", "runpy")
# Longer than the pool's own command line: the title goes on over its environment.
LONG_ARG = "--note=" + "x" * 600


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    pool = WorkerPool((), dict(os.environ), warm_later=())
    pool.start()
    try:
        pool.wait_ready(30)
        yield pool
    finally:
        pool.close()


def _request(
    worker_id: str, tmp_path: Path, kind: str, target: str, *args: str
) -> dict[str, object]:
    return {
        "id": worker_id,
        "kind": kind,
        "target": target,
        "args": list(args),
        "env": {**os.environ, "RANK": "5", "RTRAIN_GENERATION": "2", "PYTHONPATH": str(tmp_path)},
        "cwd": str(tmp_path),
        "stdout_file": str(tmp_path / f"{worker_id}.out"),
        "stderr_file": str(tmp_path / f"{worker_id}.err"),
    }


def _ps_args(pid: int) -> str:
    """`ps -o args=`, at any width (-ww: ps cuts at $COLUMNS, which pytest sets)."""
    command = ["ps", "-ww", "-o", "args=", "-p", str(pid)]
    done = subprocess.run(command, capture_output=True, text=True)
    return done.stdout.strip()


def _shown(pid: int, expected: str, timeout: float = 30) -> tuple[str, str, str]:
    """ps's args, /proc/PID/cmdline (its NUL padding cut) and comm, once ps shows
    `expected` or the time is up."""
    deadline = time.monotonic() + timeout
    while _ps_args(pid) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return _ps_args(pid), cmdline, comm


def _exits(pool: WorkerPool, count: int) -> list[WorkerExit]:
    exits: list[WorkerExit] = []
    deadline = time.monotonic() + 30
    while len(exits) < count and time.monotonic() < deadline:
        exits += pool.poll_exits(0.05)
    return exits


@pytest.mark.parametrize("start", ["forked", "spare", "fresh-interpreter"])
def test_a_worker_shows_torchruns_command_line_with_its_rank(
    pool: WorkerPool, tmp_path: Path, start: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys, time\ntime.sleep(30)\n")
    (tmp_path / "trainmod.py").write_text("import time\ntime.sleep(30)\n")
    python = sys.executable
    cases = {
        "script": (("script", str(script), "--lr", "0.1", LONG_ARG), f"{script} --lr 0.1"),
        "module": (("module", "trainmod", "--epochs=3"), "-m trainmod --epochs=3"),
    }
    pids = {}
    for name, (words, _) in cases.items():
        request = _request(name, tmp_path, *words)
        if start == "spare":
            pool.prefork(name)
        if start == "fresh-interpreter":
            request = fresh_interpreter(request)
        pids[name] = pool.spawn(request)
    comm = Path(f"/proc/{pool.pids[0]}/comm").read_text().strip()
    try:
        for name, (_, shown) in cases.items():
            long = f" {LONG_ARG}" if name == "script" else ""
            expected = f"{python} -u {shown}{long} [rank 5, generation 2]"
            args, cmdline, worker_comm = _shown(pids[name], expected)
            assert args == expected
            assert cmdline == expected
            # top's and pgrep's name stays the interpreter's, as under torchrun
            assert worker_comm == comm == Path(python).name[:15]
    finally:
        pool.signal_all(9)
        _exits(pool, len(cases))


def test_a_launched_worker_sees_its_own_title_in_ps(tmp_path: Path) -> None:
    """A real `rtrain launch`: each worker reads `ps -o args=` of itself."""
    script = tmp_path / "whoami.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "args = subprocess.run(['ps', '-ww', '-o', 'args=', '-p', str(os.getpid())],\n"
        "                      capture_output=True, text=True).stdout.strip()\n"
        "out = os.path.join(sys.argv[2], 'rank' + os.environ['RANK'] + '.txt')\n"
        "open(out, 'w').write(args)\n"
    )
    result = run(
        [*RTRAIN, "--standalone", "--nproc-per-node=2", str(script), "--out", str(tmp_path)],
        probe_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        shown = (tmp_path / f"rank{rank}.txt").read_text()
        assert shown == (
            f"{sys.executable} -u {script} --out {tmp_path} [rank {rank}, generation 0]"
        )


RAISES = "def load(batch):\n    raise ValueError(f'bad batch {batch}')\n\nload(7)\n"


@pytest.mark.parametrize("start", ["forked", "fresh-interpreter"])
@pytest.mark.parametrize("kind", ["script", "module"])
def test_a_workers_traceback_has_no_frame_of_rtrain(
    pool: WorkerPool, tmp_path: Path, start: str, kind: str
) -> None:
    (tmp_path / "failing.py").write_text(RAISES)
    target = str(tmp_path / "failing.py") if kind == "script" else "failing"
    request = _request("w", tmp_path, kind, target)
    error_file = tmp_path / "error.json"
    request["env"] = {**request["env"], "TORCHELASTIC_ERROR_FILE": str(error_file)}  # type: ignore[dict-item]
    pool.spawn(fresh_interpreter(request) if start == "fresh-interpreter" else request)
    (done,) = _exits(pool, 1)
    assert done.exitcode == 1
    printed = (tmp_path / "w.err").read_text()
    recorded = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    for trace in (printed, recorded):
        frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
        # as `python -u failing.py` prints it: the module's line, then the function's
        assert len(frames) == 2, trace
        assert all("failing.py" in frame for frame in frames), trace
        assert not any(name in trace for name in BOOT_FILES), trace
        assert trace.startswith("Traceback (most recent call last):\n"), trace
        assert trace.rstrip().endswith("ValueError: bad batch 7"), trace
