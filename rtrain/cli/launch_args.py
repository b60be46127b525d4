"""torchrun's command line, flag for flag: every dashed flag also takes its underscore
spelling and a PET_<DEST> default from the environment, exactly like torchrun. The
flags themselves are core/config/settings.py's table.

argparse is used (not typer) because torchrun's grammar needs it: options end at the
script, and everything after the script belongs to the script.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..core.config.settings import IGNORED_DEFAULTS, SETTINGS, Setting
from ..core.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"rtrain launch: {message}")


def _env_default(environ: Mapping[str, str], dest: str, default: Any) -> Any:
    return environ.get(f"PET_{dest.upper()}", default)


def _env_switch(environ: Mapping[str, str], dest: str) -> bool:
    value = environ.get(f"PET_{dest.upper()}")
    return value is not None and value.strip() not in ("", "0")


def help_text(setting: Setting) -> str:
    """The flag's help with its default, unless the help already states it."""
    text = setting.full_help
    if "(default" not in text:
        if setting.shown:
            shown = setting.shown
        elif setting.switch:
            shown = "off"
        else:
            shown = "none" if setting.default in (None, "") else str(setting.default)
        text = f"{text} (default: {shown})".lstrip()
    return text.replace("%", "%%")  # argparse formats help with %


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rtrain launch",
        description=(
            "Launch distributed training: a drop-in replacement for torchrun that survives "
            "crashed and hung ranks, sick GPUs and lost nodes. Every flag can also be set "
            "as PET_<FLAG> in the environment (e.g. PET_NNODES=2)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Training scripts may call rtrain.core.heartbeat(step) (hang detection) and "
            "rtrain.core.topology() (their dp/pp/tp ranks); RTRAIN_GENERATION is the job's "
            "generation, +1 at every restart. Exit codes: 0 success; 1 the job failed and "
            "rtrain gave up; 64 bad command line; 75 temporary failure (requeue may help); "
            "76 the nodes left cannot hold the --tp/--pp layout; 77 this node left the job for a "
            "GPU fault; 128+N stopped by signal N. Under Slurm (srun --ntasks-per-node=1) the "
            "node count, rank, rendezvous and run id come from SLURM_* unless given."
        ),
    )

    for setting in SETTINGS:
        if setting.switch:
            parser.add_argument(
                *setting.flags,
                dest=setting.dest,
                action="store_true",
                default=_env_switch(environ, setting.dest),
                help=help_text(setting),
            )
        else:
            parser.add_argument(
                *setting.flags,
                dest=setting.dest,
                default=_env_default(environ, setting.dest, setting.default),
                choices=setting.choices,
                metavar=setting.value or None,
                help=help_text(setting),
            )
    parser.add_argument("training_script", nargs="?", help="The script (or module, with -m).")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def parse_launch_args(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """Raw flag values keyed by torchrun's dests, plus `ignored_flags` the user set and
    `explicit`: the dests given on the command line or as PET_* (Slurm fills the rest)."""
    parser = build_parser(environ)
    namespace = parser.parse_args(list(argv))
    raw = vars(namespace)
    unset = object()
    parser.set_defaults(**{dest: unset for dest in raw})
    given = vars(parser.parse_args(list(argv)))
    raw["explicit"] = {d for d, v in given.items() if v is not unset} | {
        d for d in raw if f"PET_{d.upper()}" in environ
    }
    raw["ignored_flags"] = tuple(
        f"--{dest.replace('_', '-')}"
        for dest, neutral in IGNORED_DEFAULTS.items()
        if raw.get(dest) != neutral
    )
    return raw


def launch_help(environ: Mapping[str, str]) -> str:
    return build_parser(environ).format_help()
