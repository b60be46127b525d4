"""scripts/bench_repair.py's command line and one run's configuration (Setup), apart so
that the bench stays one file a reader can hold (see bench_through.py for --window)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

FAULTS = ("crash", "hang", "none")


@dataclass(frozen=True)
class Setup:
    """One configuration of the job: the fault, the new processes' start-up, the window."""

    fault: str = "crash"
    startup_s: float = 0.0
    window: float = 0.0  # 0: stop at the survivors' next step (no (b), no (c))
    hang_timeout: float = 3.0
    fault_step: int = 8


def parse(argv: list[str], title: str, launchers: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-mb", type=float, default=100.0, help="extra state per rank")
    parser.add_argument("--timeout", type=float, default=60.0, help="per run, seconds")
    parser.add_argument("--launchers", default=",".join(launchers))
    parser.add_argument("--peers-venv", default="", help="venv holding ft_launcher and torchft")
    parser.add_argument("--window", type=float, default=0.0, help="seconds after the fault")
    parser.add_argument("--startup-s", default="0", help="new processes' start-up, s, a list")
    parser.add_argument("--fault", default="crash", help="crash, hang, none: a list")
    parser.add_argument("--hang-timeout", type=float, default=3.0)
    parser.add_argument("--fault-step", type=int, default=8)
    parser.add_argument("--skip", default="", help="launcher:S:fault entries (* any) to skip")
    parser.add_argument("--json", default="", help="--window: every run's figures to this file")
    parser.add_argument("--from-json", default="", help="no runs: report these --json files")
    return parser.parse_args(argv)


def refusal(args: argparse.Namespace, launchers: list[str], known: Sequence[str]) -> str:
    unknown = sorted(set(launchers) - set(known))
    if unknown:
        return f"unknown launcher(s) {', '.join(unknown)}"
    if args.runs < 1 or args.state_mb < 0 or args.timeout <= 0 or args.window < 0:
        return "bad --runs/--state-mb/--timeout/--window"
    faults = [f for f in args.fault.split(",") if f]
    if not faults or set(faults) - set(FAULTS):
        return f"bad --fault {args.fault!r} (crash, hang, none)"
    try:
        startups = [float(s) for s in args.startup_s.split(",") if s]
    except ValueError:
        return f"bad --startup-s {args.startup_s!r}"
    if not startups or min(startups) < 0:
        return f"bad --startup-s {args.startup_s!r}"
    if not args.window and (len(faults) > 1 or len(startups) > 1 or faults == ["none"]):
        return "several --fault/--startup-s values, or none, need --window"
    return ""
