"""ScheduleReCycle against torch's own Schedule1F1B, on real gloo processes under real
torchrun: fault-free it trains to bitwise the same weights, and so it does with failed
workers whose micro-batches its plan re-routes to their stages' peers (a middle stage,
two failures in different replicas), also untagged as over NCCL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, probe_env, run_torchrun

pytestmark = pytest.mark.integration

SCRIPT = str(ROOT / "tests" / "scripts" / "pipeline_parity.py")


def trained(
    tmp: Path, name: str, dp: int, pp: int, schedule: str, *failed: str, untagged: bool = False
) -> dict:
    """stage -> the sha256 of its parameters after training, the same on every worker of
    that stage (asserted)."""
    out = tmp / name
    out.mkdir()
    alive = dp * pp - len(failed)
    args = ["--standalone", f"--nproc-per-node={alive}", SCRIPT, "--dp", str(dp)]
    args += ["--pp", str(pp), "--schedule", schedule, "--out", str(out)]
    args += [f"--fail={f}" for f in failed] + (["--untagged"] if untagged else [])
    result = run_torchrun(args, probe_env(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(records) == alive
    digests: dict[int, set[str]] = {}
    for record in records:
        digests.setdefault(record["stage"], set()).add(record["digest"])
    assert sorted(digests) == list(range(pp)) and all(len(d) == 1 for d in digests.values())
    return {stage: found.pop() for stage, found in digests.items()}


def test_fault_free_recycle_trains_bitwise_like_torch_1f1b_and_so_does_a_lost_middle_stage(
    tmp_path: Path,
) -> None:
    reference = trained(tmp_path, "torch", 2, 3, "1f1b")
    assert trained(tmp_path, "recycle", 2, 3, "recycle") == reference
    # replica 0 lost its middle stage: replica 1's stage-1 worker runs both replicas'
    # micro-batches, receiving from and sending to the other pipeline's workers
    assert trained(tmp_path, "lost", 2, 3, "recycle", "0:1") == reference


def test_failures_in_two_replicas_re_routed_train_bitwise_like_torch_1f1b(
    tmp_path: Path,
) -> None:
    reference = trained(tmp_path, "torch", 3, 2, "1f1b")
    assert trained(tmp_path, "lost", 3, 2, "recycle", "1:0", "2:1") == reference
    # untagged, as over NCCL: gloo then matches the messages between two ranks by their
    # order alone, and the plan's order on both ends keeps them apart
    assert trained(tmp_path, "untagged", 3, 2, "recycle", "1:0", "2:1", untagged=True) == reference
