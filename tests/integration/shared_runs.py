"""Reference runs made once per test run, however many pytest-xdist workers ask.

A reference run (the job without a fault, whose end state a fault test must reach) is
deterministic, so every worker that needs it would compute the same thing; with two
workers each paid for it (10-25 s each). once_per_run() runs it in the first worker to
ask, under a lock in the run's shared folder, and hands its JSON result to the others,
which wait on the lock meanwhile instead of running a second copy beside it. A run that
fails leaves no result: the next to ask runs it again and fails the same way.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_folder(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this test run shares: the base temporary folder, whose
    parent under xdist (each worker has a folder of its own below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(factory: pytest.TempPathFactory, name: str, produce: Callable[[Path], Any]) -> Any:
    """produce(a fresh folder)'s result, JSON-encodable, made once per test run under
    `name` and read back by every later caller, in any worker. JSON turns int keys into
    strings: the caller converts them back."""
    result = run_folder(factory) / f"shared-{name}.json"
    with open(f"{result}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while produce runs; freed by close
        if result.is_file():
            return json.loads(result.read_text())
        value = produce(factory.mktemp(name))
        written = result.with_suffix(".tmp")
        written.write_text(json.dumps(value))
        os.replace(written, result)
        return json.loads(result.read_text())
