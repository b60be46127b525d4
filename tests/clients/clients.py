"""The real clients: third-party training code that runs under torchrun today, as
one catalogue for tests/clients/test_clients.py and scripts/bench_clients.py.

Each script writes result_rank<R>.json into --out (client_common.write_result): the
digest of its final weights, its last loss, its step count and its own steps/s.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.helpers import ROOT, RTRAIN, probe_env, run, run_torchrun

SCRIPTS = ROOT / "tests" / "clients" / "scripts"
TIMEOUT_S = 240


@dataclass(frozen=True)
class Client:
    script: str
    length: tuple[str, int]  # the flag that sets how long it trains, and its default
    args: tuple[str, ...] = ()
    checkpoints: bool = False  # takes --ckpt-dir

    def argv(self, out: Path, ckpt: Path | None = None, scale: int = 1) -> list[str]:
        """The script's command line; `scale` trains that many times longer."""
        flag, default = self.length
        extra = ["--ckpt-dir", str(ckpt)] if ckpt is not None else []
        if scale != 1:
            extra += [flag, str(default * scale)]
        return [str(SCRIPTS / self.script), "--out", str(out), *self.args, *extra]


CLIENTS = {
    "lightning": Client("lightning_ddp.py", ("--epochs", 4), checkpoints=True),
    "accelerate": Client("accelerate_loop.py", ("--epochs", 3)),
    "hf-trainer": Client("hf_trainer.py", ("--steps", 60)),
    "fsdp2": Client("fsdp2_train.py", ("--steps", 40)),
    "dcp": Client("dcp_checkpoint.py", ("--steps", 30), checkpoints=True),
    "pipelining-gpipe": Client("pipelining.py", ("--steps", 20), ("--schedule", "gpipe")),
    "pipelining-1f1b": Client("pipelining.py", ("--steps", 20), ("--schedule", "1f1b")),
}
LAUNCH = ["--standalone", "--nproc-per-node=2"]


def results(out: Path) -> dict[int, dict[str, Any]]:
    return {
        int(p.stem.removeprefix("result_rank")): json.loads(p.read_text())
        for p in out.glob("result_rank*.json")
    }


def launch(
    launcher: str,
    client: Client,
    tmp: Path,
    *flags: str,
    timeout: float = TIMEOUT_S,
    **env: str,
) -> tuple[subprocess.CompletedProcess[str], dict[int, dict[str, Any]]]:
    """Run a client under "torchrun" or "rtrain" in tmp/<launcher>; its results by rank.
    Raises subprocess.TimeoutExpired for a run that outlasts `timeout`."""
    out = tmp / launcher
    ckpt = out / "ckpt" if client.checkpoints else None
    args = [*LAUNCH, *flags, *client.argv(out, ckpt)]
    penv = probe_env(out, **env)
    if launcher == "torchrun":
        result = run_torchrun(args, penv, timeout=timeout, fresh=out)
    else:
        result = run([*RTRAIN, *args], penv, timeout=timeout)
    return result, results(out)
