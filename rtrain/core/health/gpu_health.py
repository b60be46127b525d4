"""GPU health: NVML readings in, a verdict and an action per check out.

Pure: the agent's NVML reader fills a GpuSample per GPU, and everything here decides.
Each check returns a CheckResult: OK, WARNING (the node can work; somebody should
look), CRITICAL (a fault), UNKNOWN (the reading could not be taken) or N/A (the GPU
does not have it). The node's verdict is the worst, by node-health convention:
CRITICAL > WARNING > UNKNOWN > OK, which is also the exit code of `rtrain health`.

| check           | reading (NVML)                                | verdict, action               |
|-----------------|-----------------------------------------------|-------------------------------|
| gpu_count       | nvmlDeviceGetCount vs the expected count      | fewer: CRITICAL, reboot node  |
| gpu_lost        | NVML_ERROR_GPU_IS_LOST from any call          | CRITICAL, reboot node         |
| ecc             | volatile uncorrected ECC errors               | > max: CRITICAL, reset GPU    |
| row_remap       | remapped rows: pending / failed               | pending: CRITICAL, reset GPU; |
|                 |                                               | failed: CRITICAL, service GPU |
| retired_pages   | retired pages pending (pre-Ampere)            | CRITICAL, reset GPU           |
| xid             | critical XID events seen                      | per health.xid.classify_xid   |
| temperature     | GPU temperature vs --max-temp (default: the   | WARNING                       |
|                 | slowdown threshold minus --temp-margin)       |                               |
| clocks          | clock event reasons: HW slowdown, SW or HW    | WARNING                       |
|                 | thermal slowdown, power brake                 |                               |
| pcie            | link generation and width vs their maximum    | WARNING (generation only when |
|                 |                                               | the GPU is busy: idle GPUs    |
|                 |                                               | lower it to save power)       |
| nvlink          | inactive links among those the GPU has        | WARNING                       |
| recovery_action | the driver's GPU recovery action field        | reset / reboot / drain: CRIT. |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

from ..errors import UsageError
from .xid import Action, classify_xid, describe_xid


class Verdict(IntEnum):
    """Values are `rtrain health` exit codes (Nagios: 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3
    NA = -1  # the GPU has no such reading: never counts

    @property
    def severity(self) -> int:
        return {Verdict.NA: -1, Verdict.OK: 0, Verdict.UNKNOWN: 1}.get(self, int(self) + 1)

    @property
    def label(self) -> str:
        return "n/a" if self is Verdict.NA else self.name.lower()


def worst(verdicts: list[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: v.severity, default=Verdict.OK)


@dataclass(frozen=True)
class Unreadable:
    """A reading NVML failed to give (its error text): the check is UNKNOWN."""

    error: str


NOT_SUPPORTED = "not supported"  # the GPU lacks the reading: the check is N/A

# Clock event reason bits that mean the hardware is holding the GPU back.
CLOCK_REASONS = {
    0x08: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "power brake",
}
CLOCK_IDLE = 0x01
RECOVERY_ACTIONS = {
    0: ("none", Action.NONE),
    1: ("GPU reset", Action.RESET_GPU),
    2: ("node reboot", Action.REBOOT_NODE),
    3: ("drain P2P", Action.RESET_GPU),
    4: ("drain and reset", Action.RESET_GPU),
}
DEFAULT_SLOWDOWN_C = 85.0


@dataclass(frozen=True)
class Thresholds:
    max_temp: float | None = None  # degrees C; None: slowdown threshold - temp_margin
    temp_margin: float = 5.0
    max_uncorrected_ecc: int = 0  # volatile uncorrected ECC errors tolerated

    def __post_init__(self) -> None:
        if self.max_temp is not None and not 0 < self.max_temp <= 150:
            raise UsageError(f"--max-temp {self.max_temp:g}: a GPU temperature is 1-150 C")
        if not 0 <= self.temp_margin < 100:
            raise UsageError(f"--temp-margin {self.temp_margin:g}: must be 0-99 C")
        if self.max_uncorrected_ecc < 0:
            raise UsageError(f"--max-uncorrected-ecc {self.max_uncorrected_ecc}: must be >= 0")


@dataclass(frozen=True)
class XidEvent:
    time: float
    gpu: int
    xid: int


@dataclass
class GpuSample:
    """One GPU's readings. Each value is the reading, Unreadable, or NOT_SUPPORTED.

    readings: ecc_uncorrected_volatile (int); remapped_rows (corrected, uncorrected,
    pending, failed); retired_pages_pending (0/1); temperature, slowdown_temp (C);
    clock_reasons (bit mask); pcie (gen, max gen, width, max width); nvlinks (state per
    link the GPU has, 1 active); recovery_action (NVML_GPU_RECOVERY_ACTION_*).
    """

    index: int
    name: str = "?"
    uuid: str = "?"
    lost: bool = False
    readings: dict[str, Any] = field(default_factory=dict)
    xids: list[XidEvent] = field(default_factory=list)


@dataclass(frozen=True)
class CheckResult:
    check: str
    verdict: Verdict
    action: Action = Action.NONE
    reading: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in (Verdict.WARNING, Verdict.CRITICAL, Verdict.UNKNOWN)


def _ok(check: str, reading: str) -> CheckResult:
    return CheckResult(check, Verdict.OK, Action.NONE, reading)


def _warn(check: str, reading: str) -> CheckResult:
    return CheckResult(check, Verdict.WARNING, Action.NONE, reading)


def _crit(check: str, action: Action, reading: str) -> CheckResult:
    return CheckResult(check, Verdict.CRITICAL, action, reading)


def _ecc(value: int, t: Thresholds) -> CheckResult:
    if value > t.max_uncorrected_ecc:
        return _crit("ecc", Action.RESET_GPU, f"{value} uncorrected ECC errors (volatile)")
    return _ok("ecc", f"{value} uncorrected (volatile)")


def _row_remap(value: Any, _: Thresholds) -> CheckResult:
    corrected, uncorrected, pending, failed = (int(v) for v in value)
    text = f"{corrected} corrected, {uncorrected} uncorrected rows remapped"
    if failed:
        return _crit("row_remap", Action.SERVICE_GPU, f"row remapping failed ({text})")
    if pending:
        return _crit("row_remap", Action.RESET_GPU, f"row remap pending ({text})")
    return _ok("row_remap", text)


def _retired(value: int, _: Thresholds) -> CheckResult:
    if value:
        return _crit("retired_pages", Action.RESET_GPU, "page retirement pending")
    return _ok("retired_pages", "none pending")


def _clocks(value: int, _: Thresholds) -> CheckResult:
    held = [name for bit, name in CLOCK_REASONS.items() if value & bit]
    if held:
        return _warn("clocks", f"clocks held back: {', '.join(held)} (0x{value:x})")
    return _ok("clocks", f"0x{value:x}")


def _nvlink(value: list[int], _: Thresholds) -> CheckResult:
    down = [i for i, active in enumerate(value) if not active]
    if down:
        return _warn("nvlink", f"{len(down)} of {len(value)} links inactive: {down}")
    return _ok("nvlink", f"{len(value)} links active")


def _recovery(value: int, _: Thresholds) -> CheckResult:
    name, action = RECOVERY_ACTIONS.get(int(value), (f"unknown ({value})", Action.RESET_GPU))
    if action is Action.NONE:
        return _ok("recovery_action", name)
    return _crit("recovery_action", action, f"driver asks for: {name}")


SIMPLE_CHECKS: dict[str, tuple[str, Callable[[Any, Thresholds], CheckResult]]] = {
    "ecc": ("ecc_uncorrected_volatile", _ecc),
    "row_remap": ("remapped_rows", _row_remap),
    "retired_pages": ("retired_pages_pending", _retired),
    "clocks": ("clock_reasons", _clocks),
    "nvlink": ("nvlinks", _nvlink),
    "recovery_action": ("recovery_action", _recovery),
}


def _unreadable_or_na(check: str, *values: Any) -> CheckResult | None:
    for value in values:
        if isinstance(value, Unreadable):
            return CheckResult(check, Verdict.UNKNOWN, Action.NONE, f"unreadable: {value.error}")
    if any(v is None or v == NOT_SUPPORTED for v in values):
        return CheckResult(check, Verdict.NA)
    return None


def _temperature(sample: GpuSample, t: Thresholds) -> CheckResult:
    temp = sample.readings.get("temperature")
    blocked = _unreadable_or_na("temperature", temp)
    if blocked is not None:
        return blocked
    assert temp is not None  # _unreadable_or_na answered for None
    slowdown = sample.readings.get("slowdown_temp")
    if t.max_temp is not None:
        limit, source = t.max_temp, "--max-temp"
    elif isinstance(slowdown, (int, float)) and not isinstance(slowdown, bool):
        limit, source = float(slowdown) - t.temp_margin, f"slowdown {slowdown} C - margin"
    else:
        limit, source = DEFAULT_SLOWDOWN_C - t.temp_margin, "default slowdown - margin"
    reading = f"{temp} C (limit {limit:g} C: {source})"
    return _warn("temperature", reading) if temp >= limit else _ok("temperature", reading)


def _pcie(sample: GpuSample, _: Thresholds) -> CheckResult:
    value = sample.readings.get("pcie")
    blocked = _unreadable_or_na("pcie", value)
    if blocked is not None:
        return blocked
    assert value is not None  # _unreadable_or_na answered for None
    gen, max_gen, width, max_width = (int(v) for v in value)
    reasons = sample.readings.get("clock_reasons")
    idle = isinstance(reasons, int) and bool(reasons & CLOCK_IDLE)
    reading = f"gen {gen}/{max_gen} x{width}/x{max_width}"
    if width < max_width or (gen < max_gen and not idle):
        return _warn("pcie", f"link degraded: {reading}")
    return _ok("pcie", reading + (" (idle)" if idle and gen < max_gen else ""))


def _xids(sample: GpuSample) -> CheckResult:
    if not sample.xids:
        return _ok("xid", "none seen")
    results = []
    for event in sample.xids:
        action = classify_xid(event.xid)
        verdict = Verdict.CRITICAL if action.excludes_node else Verdict.WARNING
        results.append(CheckResult("xid", verdict, action, describe_xid(event.xid)))
    top = max(results, key=lambda r: (r.verdict.severity, r.action.rank))
    text = ", ".join(dict.fromkeys(r.reading for r in results))
    return CheckResult("xid", top.verdict, top.action, text)


CHECK_ORDER = (
    "gpu_lost",
    "ecc",
    "row_remap",
    "retired_pages",
    "xid",
    "temperature",
    "clocks",
    "pcie",
    "nvlink",
    "recovery_action",
)


def evaluate_gpu(sample: GpuSample, thresholds: Thresholds) -> list[CheckResult]:
    """Every check for one GPU, in CHECK_ORDER."""
    if sample.lost:
        return [_crit("gpu_lost", Action.REBOOT_NODE, "GPU is lost (fallen off the bus)")]
    results = {
        "gpu_lost": _ok("gpu_lost", "present"),
        "xid": _xids(sample),
        "temperature": _temperature(sample, thresholds),
        "pcie": _pcie(sample, thresholds),
    }
    for check, (key, judge) in SIMPLE_CHECKS.items():
        value = sample.readings.get(key)
        blocked = _unreadable_or_na(check, value)
        results[check] = blocked if blocked is not None else judge(value, thresholds)
    return [results[check] for check in CHECK_ORDER]


@dataclass
class GpuReport:
    index: int
    name: str
    uuid: str
    checks: list[CheckResult]

    @property
    def verdict(self) -> Verdict:
        return worst([c.verdict for c in self.checks])

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.failed]


@dataclass
class HealthReport:
    expected: int | None
    found: int
    gpus: list[GpuReport]
    node_checks: list[CheckResult]

    @property
    def verdict(self) -> Verdict:
        return worst([c.verdict for c in self.node_checks] + [g.verdict for g in self.gpus])

    @property
    def exit_code(self) -> int:
        return int(self.verdict)

    def findings(self) -> list[tuple[int | None, CheckResult]]:
        """(GPU index or None for the node, result) of every check that did not pass."""
        found: list[tuple[int | None, CheckResult]] = [
            (None, c) for c in self.node_checks if c.failed
        ]
        for gpu in self.gpus:
            found += [(gpu.index, c) for c in gpu.failed]
        return found

    def worst_action(self) -> Action:
        actions = [c.action for _, c in self.findings()]
        return max(actions, key=lambda a: a.rank, default=Action.NONE)

    def to_json(self) -> dict[str, Any]:
        def check(c: CheckResult) -> dict[str, Any]:
            return {**asdict(c), "verdict": c.verdict.label, "action": c.action.value}

        return {
            "verdict": self.verdict.label,
            "exit_code": self.exit_code,
            "expected_gpus": self.expected,
            "found_gpus": self.found,
            "node_checks": [check(c) for c in self.node_checks],
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "verdict": g.verdict.label,
                    "checks": [check(c) for c in g.checks],
                }
                for g in self.gpus
            ],
        }


def evaluate_node(
    samples: list[GpuSample], expected: int | None, thresholds: Thresholds
) -> HealthReport:
    found = len(samples)
    if expected is None:
        count = _ok("gpu_count", f"{found} GPUs (no expected count)")
    elif found < expected:
        count = _crit("gpu_count", Action.REBOOT_NODE, f"{found} GPUs, {expected} expected")
    elif found > expected:
        count = _warn("gpu_count", f"{found} GPUs, {expected} expected")
    else:
        count = _ok("gpu_count", f"{found} GPUs")
    gpus = [GpuReport(s.index, s.name, s.uuid, evaluate_gpu(s, thresholds)) for s in samples]
    return HealthReport(expected, found, gpus, [count])
