"""Classification of GPU readings and XID codes into verdicts and actions (core only)."""

from __future__ import annotations

from typing import Any

import pytest

from rtrain.core.errors import UsageError
from rtrain.core.health.gpu_health import (
    CHECK_ORDER,
    NOT_SUPPORTED,
    GpuSample,
    Thresholds,
    Unreadable,
    Verdict,
    XidEvent,
    evaluate_gpu,
    evaluate_node,
)
from rtrain.core.health.gpu_inventory import expected_gpus, watched_gpus
from rtrain.core.health.xid import (
    APPLICATION_XIDS,
    BUS_XIDS,
    ECC_XIDS,
    NVLINK_XIDS,
    RESET_XIDS,
    Action,
    classify_xid,
    describe_xid,
)

HEALTHY: dict[str, Any] = {
    "ecc_uncorrected_volatile": 0,
    "remapped_rows": (2, 0, 0, 0),
    "retired_pages_pending": 0,
    "temperature": 45,
    "slowdown_temp": 87,
    "clock_reasons": 0,
    "pcie": (5, 5, 16, 16),
    "nvlinks": [1] * 18,
    "recovery_action": 0,
}


def sample(**readings: Any) -> GpuSample:
    return GpuSample(0, "NVIDIA H100", "GPU-0", readings={**HEALTHY, **readings})


def check(result_list: list, name: str):
    return next(r for r in result_list if r.check == name)


def test_a_healthy_gpu_passes_every_check_in_order() -> None:
    results = evaluate_gpu(sample(), Thresholds())
    assert [r.check for r in results] == list(CHECK_ORDER)
    assert {r.verdict for r in results} == {Verdict.OK}


@pytest.mark.parametrize(
    ("xids", "action", "verdict"),
    [
        (APPLICATION_XIDS, Action.RESTART_WORKERS, Verdict.WARNING),
        (RESET_XIDS, Action.RESET_GPU, Verdict.CRITICAL),
        (ECC_XIDS, Action.RESET_GPU, Verdict.CRITICAL),
        (NVLINK_XIDS, Action.RESET_GPU, Verdict.CRITICAL),
        (BUS_XIDS, Action.REBOOT_NODE, Verdict.CRITICAL),
        ({1, 999}, Action.RESTART_WORKERS, Verdict.WARNING),  # not in the catalogue
    ],
)
def test_every_xid_class_maps_to_its_action(xids, action, verdict) -> None:
    assert (
        len(APPLICATION_XIDS | RESET_XIDS | ECC_XIDS | NVLINK_XIDS | BUS_XIDS) == 26
    )  # REFERENCE.md section 4
    for xid in sorted(xids):
        assert classify_xid(xid) is action
        found = sample()
        found.xids.append(XidEvent(0.0, 0, xid))
        result = check(evaluate_gpu(found, Thresholds()), "xid")
        assert (result.verdict, result.action) == (verdict, action)
        assert f"XID {xid}" in result.reading


def test_the_worst_of_several_xids_decides() -> None:
    found = sample()
    found.xids += [XidEvent(0.0, 0, 13), XidEvent(1.0, 0, 79), XidEvent(2.0, 0, 48)]
    result = check(evaluate_gpu(found, Thresholds()), "xid")
    assert result.action is Action.REBOOT_NODE and result.verdict is Verdict.CRITICAL
    assert "not in rtrain's catalogue" in describe_xid(999)
    assert describe_xid(145) == "XID 145 (NVLink error)"


@pytest.mark.parametrize(
    ("readings", "name", "verdict", "action"),
    [
        ({"ecc_uncorrected_volatile": 1}, "ecc", Verdict.CRITICAL, Action.RESET_GPU),
        ({"remapped_rows": (0, 1, 1, 0)}, "row_remap", Verdict.CRITICAL, Action.RESET_GPU),
        ({"remapped_rows": (0, 1, 0, 1)}, "row_remap", Verdict.CRITICAL, Action.SERVICE_GPU),
        ({"retired_pages_pending": 1}, "retired_pages", Verdict.CRITICAL, Action.RESET_GPU),
        ({"temperature": 82}, "temperature", Verdict.WARNING, Action.NONE),
        ({"temperature": 81}, "temperature", Verdict.OK, Action.NONE),
        ({"clock_reasons": 0x08}, "clocks", Verdict.WARNING, Action.NONE),
        ({"clock_reasons": 0x20}, "clocks", Verdict.WARNING, Action.NONE),
        ({"clock_reasons": 0x40}, "clocks", Verdict.WARNING, Action.NONE),
        ({"clock_reasons": 0x80}, "clocks", Verdict.WARNING, Action.NONE),
        ({"clock_reasons": 0x05}, "clocks", Verdict.OK, Action.NONE),  # idle, SW power cap
        ({"pcie": (5, 5, 8, 16)}, "pcie", Verdict.WARNING, Action.NONE),
        ({"pcie": (3, 5, 16, 16)}, "pcie", Verdict.WARNING, Action.NONE),
        ({"pcie": (3, 5, 16, 16), "clock_reasons": 0x01}, "pcie", Verdict.OK, Action.NONE),
        ({"nvlinks": [1, 0, 1]}, "nvlink", Verdict.WARNING, Action.NONE),
        ({"recovery_action": 1}, "recovery_action", Verdict.CRITICAL, Action.RESET_GPU),
        ({"recovery_action": 2}, "recovery_action", Verdict.CRITICAL, Action.REBOOT_NODE),
        ({"recovery_action": 3}, "recovery_action", Verdict.CRITICAL, Action.RESET_GPU),
        ({"recovery_action": 4}, "recovery_action", Verdict.CRITICAL, Action.RESET_GPU),
        ({"recovery_action": 77}, "recovery_action", Verdict.CRITICAL, Action.RESET_GPU),
    ],
)
def test_each_check_and_its_threshold(readings, name, verdict, action) -> None:
    results = evaluate_gpu(sample(**readings), Thresholds())
    result = check(results, name)
    assert (result.verdict, result.action) == (verdict, action), result
    others = [r for r in results if r.check != name]
    assert all(r.verdict is Verdict.OK for r in others), others


def test_thresholds_can_be_overridden() -> None:
    tolerant = Thresholds(max_uncorrected_ecc=2, max_temp=90)
    results = evaluate_gpu(sample(ecc_uncorrected_volatile=2, temperature=89), tolerant)
    assert check(results, "ecc").verdict is Verdict.OK
    assert check(results, "temperature").verdict is Verdict.OK
    strict = evaluate_gpu(sample(temperature=60), Thresholds(max_temp=60))
    assert check(strict, "temperature").verdict is Verdict.WARNING
    # without a slowdown reading the margin applies to a default threshold
    no_threshold = sample(temperature=80, slowdown_temp=NOT_SUPPORTED)
    assert check(evaluate_gpu(no_threshold, Thresholds()), "temperature").verdict is Verdict.WARNING


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_temp": -5},
        {"max_temp": 0},
        {"max_temp": 400},
        {"temp_margin": -1},
        {"max_uncorrected_ecc": -1},
    ],
)
def test_nonsense_thresholds_are_usage_errors(kwargs) -> None:
    with pytest.raises(UsageError) as caught:
        Thresholds(**kwargs)
    assert caught.value.exit_code == 64
    assert "--" in str(caught.value)  # names the option


def test_unreadable_is_unknown_and_unsupported_is_not_counted() -> None:
    results = evaluate_gpu(
        sample(temperature=Unreadable("Unknown Error"), nvlinks=NOT_SUPPORTED), Thresholds()
    )
    assert check(results, "temperature").verdict is Verdict.UNKNOWN
    assert "Unknown Error" in check(results, "temperature").reading
    assert check(results, "nvlink").verdict is Verdict.NA
    assert evaluate_node([sample(nvlinks=NOT_SUPPORTED)], 1, Thresholds()).exit_code == 0
    assert evaluate_node([sample(pcie=Unreadable("Unknown Error"))], 1, Thresholds()).exit_code == 3


def test_a_lost_gpu_needs_a_reboot() -> None:
    lost = GpuSample(3, lost=True)
    (result,) = evaluate_gpu(lost, Thresholds())
    assert (result.check, result.verdict, result.action) == (
        "gpu_lost",
        Verdict.CRITICAL,
        Action.REBOOT_NODE,
    )


def test_node_verdict_and_exit_code_follow_node_health_precedence() -> None:
    unknown = sample(temperature=Unreadable("Unknown Error"))
    warning = sample(clock_reasons=0x40)
    critical = sample(ecc_uncorrected_volatile=3)
    t = Thresholds()
    assert evaluate_node([sample()], 1, t).exit_code == 0
    assert evaluate_node([sample(), unknown], 2, t).exit_code == 3
    assert evaluate_node([unknown, warning], 2, t).exit_code == 1
    assert evaluate_node([unknown, warning, critical], 3, t).exit_code == 2
    report = evaluate_node([unknown, warning, critical], 3, t)
    assert report.worst_action() is Action.RESET_GPU
    assert [c.check for _, c in report.findings()] == ["temperature", "clocks", "ecc"]


def test_gpu_count_against_the_expected_count() -> None:
    t = Thresholds()
    assert evaluate_node([sample()] * 7, 8, t).node_checks[0].verdict is Verdict.CRITICAL
    assert evaluate_node([sample()] * 7, 8, t).worst_action() is Action.REBOOT_NODE
    assert evaluate_node([sample()] * 9, 8, t).node_checks[0].verdict is Verdict.WARNING
    assert evaluate_node([sample()] * 8, None, t).verdict is Verdict.OK
    assert evaluate_node([], 8, t).exit_code == 2


def test_json_has_a_row_per_gpu_with_every_check() -> None:
    report = evaluate_node([sample(), sample(remapped_rows=(0, 0, 1, 0))], 2, Thresholds())
    data = report.to_json()
    assert (data["verdict"], data["exit_code"], data["found_gpus"]) == ("critical", 2, 2)
    assert [g["verdict"] for g in data["gpus"]] == ["ok", "critical"]
    remap = next(c for c in data["gpus"][1]["checks"] if c["check"] == "row_remap")
    assert remap["action"] == "reset GPU" and "pending" in remap["reading"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"SLURM_GPUS_ON_NODE": "4"}, 4),
        ({"SLURM_JOB_GPUS": "0,1,2"}, 3),
        ({"SLURM_STEP_GPUS": "3,5", "CUDA_VISIBLE_DEVICES": "0"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, 2),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    ],
)
def test_expected_gpus_from_slurm_or_cuda(environ, expected) -> None:
    assert expected_gpus(environ) == expected


def test_a_garbled_slurm_gpu_count_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="SLURM_GPUS_ON_NODE"):
        expected_gpus({"SLURM_GPUS_ON_NODE": "four"})


def test_only_the_jobs_gpus_are_watched() -> None:
    gpus = [GpuSample(i, uuid=f"GPU-{i}abc") for i in range(4)]
    assert watched_gpus(gpus, {}) == gpus
    assert [g.index for g in watched_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,3"})] == [1, 3]
    assert [g.index for g in watched_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-2"})] == [2]
    # nothing matches (renumbered by a cgroup): watch everything rather than nothing
    assert watched_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "7"}) == gpus
