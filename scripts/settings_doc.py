"""Write the flag tables of README.md and docs/flags.md from core/config/settings.py.

    python3 scripts/settings_doc.py          # rewrite them
    python3 scripts/settings_doc.py --check  # exit 1 if either is out of date

README.md holds rtrain's own flags between `<!-- settings: own -->` and
`<!-- /settings -->`; docs/flags.md is every flag. tests/unit/core/test_settings.py
runs the check, so a flag added to the table and not to the docs fails the tests.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rtrain.core.config.settings import markdown_table

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- settings: own -->\n)(.*?)(<!-- /settings -->)", re.S)
FLAGS_DOC = """# `rtrain launch` flags

Generated from `core/config/settings.py` by `scripts/settings_doc.py`; do not edit.
Every flag also takes its underscore spelling (`--nproc_per_node`) and a default from
the environment as `PET_<FLAG>` (`PET_NPROC_PER_NODE=8`), exactly as torchrun's.

## torchrun's flags

{torchrun}
## rtrain's own flags

{own}"""


def expected() -> dict[Path, str]:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if not BLOCK.search(text):
        raise SystemExit("README.md has no <!-- settings: own --> block")
    return {
        readme: BLOCK.sub(lambda m: m.group(1) + markdown_table(own=True) + m.group(3), text),
        ROOT / "docs" / "flags.md": FLAGS_DOC.format(
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
