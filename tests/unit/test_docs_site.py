"""The documentation site (mkdocs.yml, docs/) builds in strict mode, as CI builds it: a
link to a missing page or anchor, or a page left out of the nav, fails. README.md stays
a front door, and every full script in it or on the site carries a marker, so that
tests/integration/test_docs_examples.py runs it (tests/docs_blocks.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import ROOT, blocks, pages, stray_markers

README_MAX_LINES = 300


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material come with the test extra: pip install -e '.[test]'",
)
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice about MkDocs 2
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "flags" / "index.html").exists()


def test_every_full_script_runs_in_a_test() -> None:
    """A Python block that is a whole program has a `<!-- test: ... -->` marker; markers
    sit right before a block and are of a known kind."""
    unmarked = [b.where for p in pages() for b in blocks(p) if b.full_script and b.kind is None]
    assert unmarked == [], "mark these blocks (docs/development.md, 'Code blocks that run')"
    assert [bad for p in pages() for bad in stray_markers(p)] == []


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    # It starts with the two commands that matter on a fresh machine: run a job, run
    # the tests (.ci/run runs the second; CI runs "the README's test command").
    commands = [b.text.strip() for b in blocks(ROOT / "README.md") if b.lang == "bash"][:2]
    assert commands[0].startswith('python3 -m pip install "torch==2.13.0" -e . && rtrain launch')
    assert commands[1] == (
        'python3 -m pip install "torch==2.13.0" -e ".[test]" && '
        "python3 -m pytest -q -n 2 --dist loadfile tests"
    )
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pytest -q -n 2 --dist loadfile tests\n" in ci


def test_the_readme_links_lead_somewhere() -> None:
    """README.md is not part of the site, so mkdocs does not check its links: every
    relative link names a file of the repository, and every anchor into a page is one
    of its headings (as the site's table of contents spells them)."""
    text = (ROOT / "README.md").read_text()
    broken = []
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#([^)\s]+))?\)", text):
        path, anchor = ROOT / target[0], target[1]
        if not path.exists():
            broken.append(target[0])
        elif anchor and anchor not in _anchors(path):
            broken.append(f"{target[0]}#{anchor}")
    assert broken == []


def _anchors(page: Path) -> set[str]:
    """The ids of a page's headings, as Python-Markdown's toc extension makes them."""
    toc = pytest.importorskip("markdown.extensions.toc")  # Python-Markdown: mkdocs's

    return {
        toc.slugify(re.sub(r"[`*]", "", line.lstrip("#").strip()), "-")
        for line in page.read_text().splitlines()
        if line.startswith("#")
    }
