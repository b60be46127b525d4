"""The sweep of folders dead agents left in shared memory, with real flocks: a folder
whose owner exited is freed by the next agent; a live agent's folder is never touched."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from rtrain.agent.runtime_dir import make_runtime_dir, sweep_dead

# An agent that makes its folder and dies without removing it (as a SIGKILL leaves it).
DIES = (
    "import os, sys; from rtrain.agent.runtime_dir import make_runtime_dir; "
    "print(make_runtime_dir(sys.argv[1]).path, flush=True); os._exit(0)"
)


def test_the_next_agent_frees_a_dead_agents_folder_and_keeps_a_live_ones(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    base = str(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", DIES, base], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isdir(dead)
    live = make_runtime_dir(base)  # holds its lock, as a running agent does
    try:
        assert not os.path.exists(dead)  # make_runtime_dir swept it first
        with caplog.at_level(logging.INFO, logger="rtrain.agent.runtime_dir"):
            assert sweep_dead(base) == []  # nothing else to free; the live one stays
        assert os.path.isdir(live.path)
    finally:
        live.close()
    again = subprocess.run(
        [sys.executable, "-c", DIES, base], capture_output=True, text=True, check=True
    ).stdout.strip()
    with caplog.at_level(logging.INFO, logger="rtrain.agent.runtime_dir"):
        assert sweep_dead(base) == [again]
    assert not os.path.exists(again)
    assert any(again in record.getMessage() for record in caplog.records)
