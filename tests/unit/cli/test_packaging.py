"""What the package ships beside the code: `python -m rtrain` is the `rtrain` command,
py.typed marks rtrain's type hints for its users' type checkers (PEP 561), and the
shell completes rtrain's commands (typer's --install-completion)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import rtrain
from rtrain.core.errors import ExitCode

ROOT = Path(__file__).resolve().parents[3]


def run_module(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rtrain", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_python_m_rtrain_is_the_rtrain_command() -> None:
    assert run_module("--version").stdout == f"rtrain {rtrain.__version__}\n"
    bad = run_module("launch", "--nproc-per-node=x", "train.py")
    assert bad.returncode == ExitCode.USAGE
    assert bad.stderr.startswith("rtrain: error: --nproc-per-node")


def test_py_typed_is_in_the_package_and_shipped() -> None:
    assert (Path(rtrain.__file__).parent / "py.typed").is_file()
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["options.package_data"]["rtrain"].split() == ["py.typed"]


def test_the_shell_completes_rtrains_commands() -> None:
    assert "--install-completion" in run_module("--help", COLUMNS="200").stdout
    # typer names the shell from the process tree (shellingham): run it from bash, or a
    # test run under `sh -c` gets sh's script, which is none ('; true': no exec)
    shown = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m rtrain --show-completion; true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    script = shown.stdout
    assert "_RTRAIN_COMPLETE" in script and "complete " in script
    # what bash asks of the script it installed, as it asks it
    asked = run_module(_RTRAIN_COMPLETE="complete_bash", COMP_WORDS="rtrain re", COMP_CWORD="1")
    assert (asked.returncode, asked.stdout.split()) == (0, ["report"])


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    """setup.cfg names rtrain's packages one by one: a new subpackage left out installs
    in an editable checkout and is missing from the wheel (agent/repair/ was)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = {name.strip() for name in config["options"]["packages"].split() if name.strip()}
    found = set()
    for layer in ("cli", "agent", "core"):
        for folder, _dirs, files in os.walk(ROOT / "rtrain" / layer):
            if "__init__.py" in files:
                relative = Path(folder).relative_to(ROOT / "rtrain" / layer)
                found.add(".".join(["rtrain", layer, *relative.parts]))
    assert found - listed == set()
