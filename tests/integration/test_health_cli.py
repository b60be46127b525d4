"""`rtrain health` end to end: a real process, NVML replaced at the pynvml function level
by a scenario file, everything above it the code that runs on a GPU node."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from rtrain.agent.health.fake_nvml import FakeNvml, load_scenario
from rtrain.agent.health.nvml_reader import NvmlReader
from rtrain.core.health.gpu_health import Thresholds, Verdict, evaluate_node
from rtrain.core.rendezvous.fault_history import HISTORY_FILE, FaultEntry, encode_history
from tests.integration.helpers import ROOT, error_lines, run

HEALTH = [sys.executable, "-m", "rtrain.cli.main", "health"]
SCENARIOS = ROOT / "tests" / "scenarios"


def health(*args: str, **env: str):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VIS"))}
    environ.pop("RTRAIN_FAKE_NVML", None)
    return run([*HEALTH, *args], {**environ, "COLUMNS": "200", **env}, timeout=60)


@pytest.mark.parametrize(
    ("scenario", "code", "verdict"),
    [
        ("healthy_8gpu.json", 0, "OK"),
        ("warning.json", 1, "WARNING"),
        ("critical.json", 2, "CRITICAL"),
        ("unknown.json", 3, "UNKNOWN"),
    ],
)
def test_each_verdict_has_its_exit_code_and_a_table(scenario, code, verdict) -> None:
    done = health("--fake-nvml", str(SCENARIOS / scenario))
    assert done.returncode == code, done.stdout + done.stderr
    assert f"GPU health: {verdict}" in done.stdout
    assert "Traceback" not in done.stderr
    rows = [line for line in done.stdout.splitlines() if "GPU-" in line]
    assert len(rows) == len(load_scenario(str(SCENARIOS / scenario))["gpus"])


def test_the_table_shows_the_reading_behind_each_failed_check() -> None:
    out = health("--fake-nvml", str(SCENARIOS / "critical.json")).stdout
    assert "row remap pending" in out and "reset GPU" in out
    assert "XID 79 (GPU has fallen off the bus)" in out and "reboot node" in out
    warm = health("--fake-nvml", str(SCENARIOS / "warning.json")).stdout
    assert "84 C (limit 82 C" in warm and "HW thermal slowdown" in warm and "x8/x16" in warm


def test_json_is_the_same_report() -> None:
    done = health("--fake-nvml", str(SCENARIOS / "critical.json"), "--json")
    assert done.returncode == 2
    data = json.loads(done.stdout)
    assert (data["verdict"], data["exit_code"], data["found_gpus"]) == ("critical", 2, 3)
    verdicts = [g["verdict"] for g in data["gpus"]]
    assert verdicts == ["ok", "critical", "critical"]
    xid = next(c for c in data["gpus"][2]["checks"] if c["check"] == "xid")
    assert xid["action"] == "reboot node"


def test_no_driver_is_unknown_with_a_clear_message() -> None:
    done = health("--fake-nvml", str(SCENARIOS / "no_driver.json"))
    assert done.returncode == 3
    assert "no NVIDIA driver on this node" in done.stderr and "Traceback" not in done.stderr
    as_json = health("--fake-nvml", str(SCENARIOS / "no_driver.json"), "--json")
    assert json.loads(as_json.stdout)["verdict"] == "unknown" and as_json.returncode == 3


def test_the_expected_count_comes_from_slurm_or_the_flag() -> None:
    healthy = str(SCENARIOS / "healthy_8gpu.json")
    assert health("--fake-nvml", healthy, SLURM_GPUS_ON_NODE="8").returncode == 0
    short = health("--fake-nvml", healthy, SLURM_GPUS_ON_NODE="9")
    assert short.returncode == 2 and "8 GPUs, 9 expected" in short.stdout
    flag_wins = health("--fake-nvml", healthy, "--expect-gpus", "8", SLURM_GPUS_ON_NODE="2")
    assert flag_wins.returncode == 0


def test_only_the_gpus_cuda_visible_devices_names_are_checked() -> None:
    critical = str(SCENARIOS / "critical.json")  # GPU 1 and GPU 2 are sick
    mine = health("--fake-nvml", critical, "--json", CUDA_VISIBLE_DEVICES="0")
    data = json.loads(mine.stdout)
    assert mine.returncode == 0 and [g["index"] for g in data["gpus"]] == [0]
    assert data["expected_gpus"] == 1
    by_uuid = health("--fake-nvml", critical, "--json", CUDA_VISIBLE_DEVICES="GPU-sick-2")
    assert by_uuid.returncode == 2
    assert [g["index"] for g in json.loads(by_uuid.stdout)["gpus"]] == [2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-temp", "-5"], "--max-temp -5"),
        (["--max-temp", "hot"], "max-temp"),
        (["--temp-margin", "-1"], "--temp-margin"),
        (["--expect-gpus", "-2"], "expect-gpus"),
        (["--bogus"], "--bogus"),
        (["--drain"], "--drain needs Slurm"),
    ],
)
def test_usage_errors_exit_64_never_a_verdict(args, message) -> None:
    done = health("--fake-nvml", str(SCENARIOS / "critical.json"), *args)
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(error_lines(done.stderr)) == 1 and message in done.stderr
    assert "Traceback" not in done.stderr and "GPU health" not in done.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"gpus": [{"readings": {"temperature": "hot"}}]}', "temperature must be an integer"),
        ('{"gpus": [{"readings": {"fan": 3}}]}', "known readings are"),
        ('{"gpus": [{"timeline": [{"at": -1, "xid": 79}]}]}', '"at" must be a number'),
        ('{"gpus": [{"timeline": [{"at": 1, "xid": "79"}]}]}', '"xid" must be a positive'),
        ('{"gpus": [{"errors": {"pcie": "SOMETIMES"}}]}', "not an NVML error name"),
        ('{"gpus": [{"readings": {"pcie": [5, 5]}}]}', "pcie must be a list of 4"),
        ("[]", 'with a "gpus" list'),
    ],
)
def test_a_malformed_scenario_is_one_line_and_64(tmp_path: Path, content, message) -> None:
    scenario = tmp_path / "bad.json"
    scenario.write_text(content)
    done = health("--fake-nvml", str(scenario))
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(error_lines(done.stderr)) == 1 and message in done.stderr, done.stderr
    missing = health("--fake-nvml", str(tmp_path / "absent.json"))
    assert missing.returncode == 64 and "cannot read NVML scenario" in missing.stderr


def test_an_unexpected_nvml_error_makes_that_check_unknown_not_a_crash() -> None:
    nvml = FakeNvml({"gpus": [{"errors": {"pcie": "UNKNOWN", "nvlinks": "NO_PERMISSION"}}]})
    nvml.nvmlInit()
    (sample,) = NvmlReader(nvml).sample_all()
    report = evaluate_node([sample], 1, Thresholds())
    verdicts = {c.check: c.verdict for c in report.gpus[0].checks}
    assert verdicts["pcie"] is Verdict.UNKNOWN and verdicts["nvlink"] is Verdict.UNKNOWN
    assert verdicts["ecc"] is Verdict.OK and report.exit_code == 3


def test_a_gpu_that_disappears_between_two_samples(tmp_path: Path) -> None:
    trigger = tmp_path / "pull-gpu-1"
    nvml = FakeNvml(
        {
            "gpus": [
                {"uuid": "GPU-0"},
                {"uuid": "GPU-1", "timeline": [{"after_file": str(trigger), "gone": True}]},
                {"uuid": "GPU-2", "timeline": [{"after_file": str(trigger), "lost": True}]},
            ]
        }
    )
    nvml.nvmlInit()
    reader = NvmlReader(nvml)
    assert evaluate_node(reader.sample_all(), 3, Thresholds()).exit_code == 0
    trigger.touch()
    report = evaluate_node(reader.sample_all(), 3, Thresholds())
    assert report.found == 2 and report.exit_code == 2
    assert report.node_checks[0].reading == "2 GPUs, 3 expected"
    assert report.gpus[1].checks[0].check == "gpu_lost"  # GPU-2, now index 1, off the bus


def test_the_fault_history_is_shown_and_a_flipped_byte_refused(tmp_path: Path) -> None:
    """--fault-history: each host's faults within the window from the file the agents
    keep in --checkpoint-dir; a corrupted file is one line and exit 3, never read."""
    now = time.time()
    entries = [
        FaultEntry("node-a", "signal", now - 7200, "run1"),
        FaultEntry("node-a", "hang", now - 60, "run2"),
        FaultEntry("node-b", "lost_node", now - 3 * 86400, "run1"),  # outside the day's window
    ]
    path = tmp_path / HISTORY_FILE
    path.write_bytes(encode_history(entries))
    healthy = str(SCENARIOS / "healthy_8gpu.json")
    done = health("--fake-nvml", healthy, "--fault-history", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["fault_history"]
    assert shown["recent"] == {"node-a": 2} and shown["total"] == 3
    assert [e["kind"] for e in shown["entries"]] == ["lost_node", "signal", "hang"]
    table = health("--fake-nvml", healthy, "--fault-history", str(tmp_path)).stdout
    assert "fault history: 3 entries" in table and "hang at" in table
    data = bytearray(path.read_bytes())
    data[data.index(b"node-a")] ^= 0x01  # "oode-a": the digest no longer matches
    path.write_bytes(bytes(data))
    bad = health("--fake-nvml", healthy, "--fault-history", str(tmp_path))
    assert bad.returncode == 3 and len(error_lines(bad.stderr)) == 1, bad.stderr
    assert "Traceback" not in bad.stderr
