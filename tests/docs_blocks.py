"""The code blocks of README.md and the documentation site (docs/), and the markers that
say which of them a test runs (docs/development.md, "Code blocks that run").

A marker is an HTML comment on the line right before a block's opening fence:

    <!-- test: file NAME -->                    the block is a file the page's later blocks use
    <!-- test: run [expect="TEXT"]... -->       bash runs the block (installs left out)
    <!-- test: launch FLAGS [-- ARGS] [expect="TEXT"]... -->
                                                `rtrain launch --standalone FLAGS script ARGS`
    <!-- test: skip REASON -->                  a full script that no test runs, and why

tests/unit/test_docs_site.py holds every full script to having a marker;
tests/integration/test_docs_examples.py runs them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- test: (\w+)(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
KINDS = ("file", "run", "launch", "skip")
# A Python block that is a whole program, not a fragment of one.
FULL_SCRIPT = re.compile(r'if __name__ == "__main__"|init_process_group\(|rtrain\.repairable')
# An install in a shell block: `python3 -m pip install ... &&` before the command that
# runs, or a line of its own. Tests never install.
INSTALL = re.compile(r"^\s*(python3? -m )?pip3? install [^&]*(&&\s*|$)")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/quickstart.md
    line: int  # the opening fence's, from 1
    lang: str
    text: str
    kind: str | None = None  # the marker's, None for a block without one
    words: tuple[str, ...] = ()  # the marker's arguments, expect= ones left out
    expect: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def full_script(self) -> bool:
        return self.lang == "python" and FULL_SCRIPT.search(self.text) is not None


@dataclass(frozen=True)
class Case:
    """One block a test runs, with the files it names that the page's earlier blocks
    defined."""

    block: Block
    files: tuple[tuple[str, str], ...] = field(default=())

    def key(self) -> tuple[object, ...]:
        """Equal for the same command on the same files, wherever it is shown (README's
        commands reappear in the quick start): each runs once."""
        return (self.block.kind, self.block.words, self.block.text, self.files)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one page, each with the marker right before it."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, info = opening.groups()
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence[0] * len(fence))
            and lines[end].strip().strip(fence[0]) == ""
        ):
            end += 1
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        kind, words, expect = None, (), ()
        if marker is not None:
            kind = marker.group(1)
            parsed = shlex.split(marker.group(2))
            expect = tuple(w[len("expect=") :] for w in parsed if w.startswith("expect="))
            words = tuple(w for w in parsed if not w.startswith("expect="))
        lang = info.strip().split(" ")[0]
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n", kind, words, expect))
        i = end + 1
    return found


def stray_markers(path: Path) -> list[str]:
    """Markers not right before a fence, or of an unknown kind: each `page:line why`."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    bad = []
    for i, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        if marker.group(1) not in KINDS:
            bad.append(f"{page}:{i + 1} unknown marker {marker.group(1)!r}")
        elif i + 1 >= len(lines) or FENCE.match(lines[i + 1]) is None:
            bad.append(f"{page}:{i + 1} marker not on the line before a code block")
    return bad


def cases() -> list[Case]:
    """Every block a test runs, each once, in page order."""
    seen: set[tuple[object, ...]] = set()
    found: list[Case] = []
    for path in pages():
        files: dict[str, str] = {}
        for block in blocks(path):
            if block.kind == "file":
                files[block.words[0]] = block.text
            elif block.kind in ("run", "launch"):
                used = {n: text for n, text in files.items() if n in block.text}
                case = Case(block, tuple(sorted(used.items())))
                if case.key() not in seen:
                    seen.add(case.key())
                    found.append(case)
    return found


def shell_script(text: str) -> str:
    """A `run` block as bash runs it: installs left out."""
    kept = []
    for line in text.splitlines():
        install = INSTALL.match(line)
        if install is None:
            kept.append(line)
        elif line[install.end() :].strip():
            kept.append(line[install.end() :])
    return "\n".join(kept) + "\n"
