"""Every full script and command that README.md and the documentation site mark to run
(tests/docs_blocks.py; docs/development.md, "Code blocks that run") runs here, as a
reader would run it: real `rtrain launch` processes on the CPU, in a scratch folder with
the repository's examples/, `rtrain` on the PATH, installs left out. Each must exit 0
and print what its marker expects. A command shown on two pages runs once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import ROOT, Case, cases, shell_script

pytestmark = pytest.mark.integration

TIMEOUT_S = 120.0  # a case takes 2-8 s on an idle 2-core machine
CASES = cases()


def _scratch(tmp_path: Path, case: Case) -> dict[str, str]:
    """The folder a reader would be in, and the environment: examples/ of the
    repository, the page's files, and an `rtrain` command that runs this interpreter."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for name, text in case.files:
        (tmp_path / name).write_text(text)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "rtrain"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rtrain "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _command(case: Case, tmp_path: Path) -> list[str]:
    block = case.block
    if block.kind == "run":
        return ["bash", "-euo", "pipefail", "-c", shell_script(block.text)]
    words = list(block.words)
    cut = words.index("--") if "--" in words else len(words)
    flags, args = words[:cut], words[cut + 1 :]
    script = tmp_path / "example.py"
    script.write_text(block.text)
    return [sys.executable, "-m", "rtrain", "launch", "--standalone", *flags, script.name, *args]


@pytest.mark.parametrize("case", CASES, ids=[c.block.where for c in CASES])
def test_the_example_runs_as_written(case: Case, tmp_path: Path) -> None:
    env = _scratch(tmp_path, case)
    proc = subprocess.Popen(
        _command(case, tmp_path),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # The session this test started: the launch, its agent and its workers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{case.block.where} still running after {TIMEOUT_S:.0f} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{case.block.where} exited {proc.returncode}:\n{out[-4000:]}"
    for text in case.block.expect:
        assert text in out, f"{case.block.where} did not print {text!r}:\n{out[-4000:]}"


def test_every_marked_page_has_something_to_run() -> None:
    """The markers are found: README's first command and its two recipes at least."""
    where = {c.block.page for c in CASES}
    assert "README.md" in where and len([c for c in CASES if c.block.page == "README.md"]) >= 3
