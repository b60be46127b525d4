"""What a cluster's tooling reads from rtrain: --log-format json lines, and torch's
flight recorder on GPU nodes, its dumps named in the failure they belong to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import PROBE, RTRAIN, events_under, probe_env, run

pytestmark = pytest.mark.integration

# A worker that records torch's variables, then leaves what NCCL's watchdog would
# (<TORCH_FR_DUMP_TEMP_FILE><rank>) and fails; no GPU is needed to check the plumbing.
DUMPING = """
import json, os, sys
out, rank = os.environ["PROBE_OUT"], os.environ["RANK"]
with open(os.path.join(out, f"env{rank}.json"), "w") as handle:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("TORCH_")}, handle)
with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + rank, "wb") as handle:
    handle.write(b"flight recorder dump")
sys.exit(3)
"""


def test_log_format_json_makes_every_rtrain_line_one_object(tmp_path: Path) -> None:
    result = run([*RTRAIN, "--nproc-per-node=1", "--log-format=json", PROBE], probe_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert not [line for line in lines if line.startswith("[rtrain ")]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all(r["logger"].startswith("rtrain") for r in records)
    assert {(r["node"], r["generation"]) for r in records} >= {(None, None), (0, 0)}
    assert any("started 1 worker (ranks 0-0 of 1)" in r["message"] for r in records)


def test_gpu_workers_get_the_flight_recorder_and_its_dump_is_named(tmp_path: Path) -> None:
    script, logs = tmp_path / "dumping.py", tmp_path / "logs"
    script.write_text(DUMPING)
    env = probe_env(tmp_path, CUDA_VISIBLE_DEVICES="0")  # a GPU node, as the agent sees it
    result = run(
        [*RTRAIN, "--nproc-per-node=1", "--max-restarts=0", f"--log-dir={logs}", str(script)], env
    )
    assert result.returncode == 1, result.stderr
    (run_dir,) = logs.iterdir()
    folder = run_dir / "attempt_0" / "0"
    seen = json.loads((tmp_path / "env0.json").read_text())
    prefix = str(folder / "nccl_trace_rank_")
    assert seen["TORCH_FR_BUFFER_SIZE"] == seen["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert seen["TORCH_FR_DUMP_TEMP_FILE"] == seen["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    (fault,) = events_under(logs, "fault")
    assert fault["message"].endswith(f"(flight recorder: {prefix}0)")
    assert f"{prefix}0" in result.stderr  # the failure report names it too
