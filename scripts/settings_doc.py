"""Write the documentation site's flag reference, docs/flags.md, from the settings table.

    python3 scripts/settings_doc.py          # rewrite it
    python3 scripts/settings_doc.py --check  # exit 1 if it is out of date

core/config/settings.py holds every flag of `rtrain launch` (name, default, meaning);
docs/flags.md is that table as a page of the site (mkdocs.yml), committed so that it
reads on GitHub too and the site builds without importing rtrain.
tests/unit/core/test_settings.py runs the check, so a flag added to the table and not
to the page fails the tests. README.md carries no flag table: it links to the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rtrain.core.config.settings import markdown_table

ROOT = Path(__file__).resolve().parents[1]
FLAGS_PAGE = ROOT / "docs" / "flags.md"
FLAGS_DOC = """# Flags and settings

<!-- Generated from core/config/settings.py by scripts/settings_doc.py; do not edit. -->

Every flag of `rtrain launch`, generated from the settings table in
`core/config/settings.py`, the same table that parses them, so this page and the code
cannot differ (`tests/unit/core/test_settings.py` fails when they do).
`rtrain launch --help` prints the same flags and defaults.

Every flag also takes its underscore spelling (`--nproc_per_node`) and a default from
the environment as `PET_<FLAG>` (`PET_NPROC_PER_NODE=8`), exactly as torchrun's. Flags
marked *accepted for compatibility* are torchrun's and do nothing under rtrain; a launch
that sets one prints a warning. Other variables rtrain reads are on
[Environment variables](environment.md).

## torchrun's flags

{torchrun}
## rtrain's own flags

{own}"""


def expected() -> dict[Path, str]:
    """Each generated file, and what it must hold."""
    return {
        FLAGS_PAGE: FLAGS_DOC.format(
            torchrun=markdown_table(own=False), own=markdown_table(own=True)
        ),
    }


def stale() -> list[Path]:
    return [p for p, text in expected().items() if not p.exists() or p.read_text() != text]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        out_of_date = stale()
        for path in out_of_date:
            print(f"{path.relative_to(ROOT)} is out of date: run scripts/settings_doc.py")
        return 1 if out_of_date else 0
    for path, text in expected().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
