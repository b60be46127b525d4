"""`rtrain report` draws its timeline on a plain install (issue 48 item 4): it printed
"no picture: matplotlib is not installed" unless the `plan` extra was installed, though
the docs promise a PNG and an SVG. Here a real run's report writes both, and every
package the report imports is one that `pip install rtrain` brings: setup.cfg's
install_requires, or what those require in turn (as the installed packages' metadata
says), so a fresh install has them all."""

from __future__ import annotations

import configparser
import contextlib
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.integration.helpers import PROBE, ROOT, RTRAIN, probe_env, run

pytestmark = pytest.mark.integration

# Runs the report as the `rtrain` command does, then lists the top-level modules it
# imported (those already there at start, the interpreter's own, are left out).
REPORT = """
import json, sys
before = set(sys.modules)
from rtrain.cli.main import main
sys.argv = ["rtrain", "report", *sys.argv[2:]]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
with open(OUT, "w") as handle:
    json.dump(sorted({m.split(".")[0] for m in set(sys.modules) - before}), handle)
sys.exit(code)
"""


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def install_closure() -> set[str]:
    """The distributions `pip install rtrain` installs: install_requires and, from the
    installed packages' metadata, what they require (no extras)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    todo = [Requirement(ln) for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = _name(requirement.name)
        if name in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        with contextlib.suppress(metadata.PackageNotFoundError):  # not installed here
            todo += [Requirement(r) for r in metadata.requires(requirement.name) or []]
    return seen


def test_a_report_draws_its_timeline_with_rtrains_own_dependencies(tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "pictures"
    args = ["--standalone", "--nproc-per-node=2", "--max-restarts=1", f"--log-dir={logs}"]
    env = probe_env(tmp_path, PROBE_STEPS="6", PROBE_FAULT="rank=1,step=2,gen=0,action=exit")
    done = run([*RTRAIN, *args, PROBE], env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = tmp_path / "modules.json"
    script = REPORT.replace("OUT", repr(str(modules)))
    report = subprocess.run(
        [sys.executable, "-c", script, "report", str(logs), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "no picture" not in report.stdout
    png, svg = out / "rtrain-report.png", out / "rtrain-report.svg"
    assert f"timeline: {png}" in report.stdout and f"timeline: {svg}" in report.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ElementTree.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(list(root.iter())) > 50  # drawn: generations, faults, axes
    imported = set(json.loads(modules.read_text()))
    assert "matplotlib" in imported
    owners = metadata.packages_distributions()
    needed = {
        _name(dist)
        for module in imported - set(sys.stdlib_module_names) - {"rtrain"}
        for dist in owners.get(module, [])
    }
    missing = needed - install_closure()
    assert not missing, f"the report imports {sorted(missing)}, which a plain install lacks"
