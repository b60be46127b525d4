"""What one row of the settings table is (gunicorn's Setting): a flag's name, default,
help, how it is spelled and documented, and the check that turns its raw value into the
spec's. The rows are core/config/torchrun_flags.py's and core/config/settings.py's. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import Check

NOT_ACTED_ON = "[accepted for compatibility, not acted on]"


@dataclass(frozen=True)
class Setting:
    """One flag. Every flag is also read from PET_<DEST> (torchrun's convention)."""

    name: str  # the dashed long name without "--": "nproc-per-node"
    default: Any  # the raw value argparse hands on when the flag is absent
    help: str
    value: str = ""  # the metavar in docs ("N", "S", "FILE"); "" for a switch
    switch: bool = False  # takes no value (store_true)
    short: str | None = None  # "-m", "-r", "-t"
    underscore: bool = True  # also --nproc_per_node, as torchrun
    choices: tuple[str, ...] | None = None
    own: bool = False  # rtrain's own, not torchrun's
    acted_on: bool = True  # False: torchrun's, accepted and ignored (the default changes nothing)
    # How a raw value becomes the spec's, or one line naming the flag (checks.py). Every
    # row has one (tests/unit/core/test_settings.py); None hands the raw value on.
    check: Check | None = None
    # What --help gives as the default where the raw one (None, "") says little.
    shown: str = ""

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return f"PET_{self.dest.upper()}"

    @property
    def flags(self) -> tuple[str, ...]:
        dashed = f"--{self.name}"
        under = f"--{self.dest}"
        spellings = (dashed, under) if self.underscore and under != dashed else (dashed,)
        return (self.short, *spellings) if self.short else spellings

    @property
    def full_help(self) -> str:
        return self.help if self.acted_on else f"{NOT_ACTED_ON} {self.help}".rstrip()

    def parse(self, raw: Any) -> Any:
        """raw (a string, the default, or what Slurm filled in) as the spec takes it;
        UsageError, one line naming the flag, for a bad value."""
        return raw if self.check is None else self.check(self, raw)

    @property
    def typed_default(self) -> Any:
        """The default as the spec takes it (for the spec dataclasses' defaults)."""
        return self.parse(self.default)

    def markdown_row(self) -> str:
        """The flag's row in README's and docs/flags.md's tables."""
        flag = f"`--{self.name} {self.value}`" if self.value else f"`--{self.name}`"
        if self.short:
            flag = f"`{self.short}`, {flag}"
        shown = "" if self.switch or self.default in (None, "") else f"`{self.default}`"
        return f"| {flag} | {shown} | {self.full_help} |"
