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
    args: tuple[str, ...] = ()
    checkpoints: bool = False  # takes --ckpt-dir

    def argv(self, out: Path, ckpt: Path | None = None) -> list[str]:
        extra = ["--ckpt-dir", str(ckpt)] if ckpt is not None else []
        return [str(SCRIPTS / self.script), "--out", str(out), *self.args, *extra]


CLIENTS = {
    "lightning": Client("lightning_ddp.py", checkpoints=True),
    "accelerate": Client("accelerate_loop.py"),
    "hf-trainer": Client("hf_trainer.py"),
    "fsdp2": Client("fsdp2_train.py"),
    "dcp": Client("dcp_checkpoint.py", checkpoints=True),
    "pipelining-gpipe": Client("pipelining.py", ("--schedule", "gpipe")),
    "pipelining-1f1b": Client("pipelining.py", ("--schedule", "1f1b")),
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
        result = run_torchrun(args, penv, timeout=timeout)
    else:
        result = run([*RTRAIN, *args], penv, timeout=timeout)
    return result, results(out)
