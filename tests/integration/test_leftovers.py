"""A node killed whole (its agent and workers SIGKILLed at once, as a lost machine or an
OOM killer leaves them) leaves its run folder in shared memory; the next agent on the
machine removes it, and never a live agent's (issue 47 item 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rtrain.agent.runtime_dir import BASE_ENV, PREFIX
from tests.integration.helpers import ROOT, RTRAIN, run

pytestmark = pytest.mark.integration

TRAINS = (
    "import time, torch.distributed as dist\ndist.init_process_group('gloo')\ntime.sleep(120)\n"
)
QUICK = "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"


def _folders(base: Path) -> set[str]:
    return {p.name for p in base.iterdir() if p.name.startswith(PREFIX)}


def _node(tmp_path: Path, env: dict[str, str], args: list[str]) -> subprocess.Popen[bytes]:
    """A node that trains until it is killed, in its own process group: the whole node,
    and only it, goes with one killpg."""
    return subprocess.Popen(
        [*RTRAIN, *args, str(tmp_path / "trains.py")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_the_next_agent_removes_the_folder_of_a_node_killed_whole(tmp_path: Path) -> None:
    base = tmp_path / "shm"
    base.mkdir()
    (tmp_path / "trains.py").write_text(TRAINS)
    (tmp_path / "quick.py").write_text(QUICK)
    env = {**os.environ, BASE_ENV: str(base)}
    args = ["--standalone", "--nproc-per-node=2"]
    killed, live = _node(tmp_path, env, args), _node(tmp_path, env, args)
    try:
        deadline = time.monotonic() + 60
        while len(_folders(base)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        folders = _folders(base)
        assert len(folders) == 2, folders
        (left,) = [f for f in folders if f.startswith(f"{PREFIX}{killed.pid}-")]
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)
        assert left in _folders(base)  # nobody removed it: a SIGKILL runs no cleanup
        result = run([*RTRAIN, *args, str(tmp_path / "quick.py")], env, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        remaining = _folders(base)
        assert left not in remaining  # the next agent swept the dead one's folder
        assert [f for f in remaining if f.startswith(f"{PREFIX}{live.pid}-")]  # not this
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
