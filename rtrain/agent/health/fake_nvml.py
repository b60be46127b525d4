"""A fake NVML at the `pynvml` function level, replaying a scenario file.

For tests and for operators' drills on machines without a GPU: set
RTRAIN_FAKE_NVML=<scenario.json> (or `rtrain health --fake-nvml FILE`) and everything
above this boundary (the reader, the monitor, the verdicts, the agent's reaction) is
the code that runs on a GPU node. Errors are pynvml's own NVMLError classes and codes.

Scenario (JSON; docs/fake-nvml.md has the full reference):

    {"driver": true,
     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...",
               "readings": {"temperature": 41, "remapped_rows": [0, 0, 0, 0]},
               "unsupported": ["retired_pages_pending"],
               "errors": {"pcie": "UNKNOWN"},
               "timeline": [{"at": 4.0, "xid": 79},
                            {"at": 5.0, "readings": {"remapped_rows": [0, 0, 1, 0]}},
                            {"at": 6.0, "lost": true},
                            {"at": 7.0, "gone": true}]}]}

Timeline entries apply in order, each once it is due: "at" is seconds since this
process first called nvmlInit; "after_file" (instead of, or with, "at") waits for that
file to exist, so a test or a drill can fire an event at a moment of its choosing.
"lost": every call on the GPU raises NVML_ERROR_GPU_IS_LOST; "gone": it is no longer
enumerated at all.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from ...core.clock import Clock
from ...core.errors import UsageError
from ..waiting import SYSTEM_CLOCK

HEALTHY: dict[str, Any] = {
    "temperature": 40,
    "slowdown_temp": 87,
    "ecc_uncorrected_volatile": 0,
    "remapped_rows": [0, 0, 0, 0],
    "retired_pages_pending": 0,
    "clock_reasons": 0,
    "pcie": [5, 5, 16, 16],  # gen, max gen, width, max width
    "nvlinks": [1] * 18,
    "recovery_action": 0,
}
SHAPES = {"remapped_rows": 4, "pcie": 4, "nvlinks": None}  # lists; None: any length
EVENT_KEYS = {"at", "after_file", "xid", "readings", "lost", "gone", "errors"}
GPU_KEYS = {"name", "uuid", "readings", "unsupported", "errors", "timeline"}


class ScenarioError(UsageError):
    """A scenario file rtrain cannot replay: one line naming what is wrong."""


@dataclass
class _Gpu:
    index: int
    name: str
    uuid: str
    readings: dict[str, Any]
    unsupported: set[str]
    errors: dict[str, int]
    timeline: list[dict[str, Any]]
    lost: bool = False
    gone: bool = False
    applied: int = 0  # timeline entries already applied
    delivered: set[int] = field(default_factory=set)  # XID entries already waited for


def load_scenario(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ScenarioError(f"cannot read NVML scenario {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"NVML scenario {path} is not JSON: {exc}") from None
    _validate(data, path)
    return data


def _validate(data: Any, path: str) -> None:
    def bad(what: str) -> ScenarioError:
        return ScenarioError(f"NVML scenario {path}: {what}")

    if not isinstance(data, dict) or not isinstance(data.get("gpus", []), list):
        raise bad('expected an object with a "gpus" list')
    for i, gpu in enumerate(data.get("gpus", [])):
        if not isinstance(gpu, dict) or set(gpu) - GPU_KEYS:
            raise bad(f"gpus[{i}] must be an object with keys from {sorted(GPU_KEYS)}")
        _check_readings(gpu.get("readings", {}), f"{path}: gpus[{i}].readings")
        for name, code in gpu.get("errors", {}).items():
            _error_code(code, f"{path}: gpus[{i}].errors.{name}")
        for j, event in enumerate(gpu.get("timeline", [])):
            where = f"gpus[{i}].timeline[{j}]"
            if not isinstance(event, dict) or set(event) - EVENT_KEYS:
                raise bad(f"{where} must be an object with keys from {sorted(EVENT_KEYS)}")
            at = event.get("at", 0)
            if not isinstance(at, (int, float)) or isinstance(at, bool) or at < 0:
                raise bad(f'{where}: "at" must be a number of seconds >= 0, not {at!r}')
            if "at" not in event and not isinstance(event.get("after_file"), str):
                raise bad(f'{where}: give "at" (seconds) or "after_file" (a path)')
            if "xid" in event and (not isinstance(event["xid"], int) or event["xid"] <= 0):
                raise bad(f'{where}: "xid" must be a positive integer')
            _check_readings(event.get("readings", {}), f"{path}: {where}.readings")


def _check_readings(readings: Any, where: str) -> None:
    if not isinstance(readings, dict) or set(readings) - set(HEALTHY):
        raise ScenarioError(f"{where}: known readings are {sorted(HEALTHY)}")
    for name, value in readings.items():
        if name in SHAPES:
            length = SHAPES[name]
            ok = isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)
            ok = ok and (length is None or len(value) == length)
            shape = f"a list of {length or 'any number of'} integers >= 0"
        else:
            ok, shape = _is_int(value), "an integer"
        if not ok:
            raise ScenarioError(f"{where}.{name} must be {shape}, not {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _error_code(name: Any, where: str) -> int:
    code = getattr(pynvml, f"NVML_ERROR_{name}", None) if isinstance(name, str) else None
    if not isinstance(code, int):
        raise ScenarioError(f"{where}: {name!r} is not an NVML error name (e.g. UNKNOWN)")
    return code


def _due(event: dict[str, Any], now: float) -> bool:
    if event.get("at", 0) > now:
        return False
    return "after_file" not in event or os.path.exists(event["after_file"])


class FakeNvml:
    """The pynvml functions rtrain calls, answering from a scenario, under pynvml's
    names. Anything else (constants, error classes) is pynvml's own."""

    def __init__(self, scenario: dict[str, Any], clock: Clock = SYSTEM_CLOCK) -> None:
        """clock: the scenario's timeline (its `at`s count from nvmlInit) and event waits."""
        self._scenario = scenario
        self._clock = clock
        self._start: float | None = None
        self._lock = threading.Lock()
        self._gpus = [
            _Gpu(
                index=i,
                name=g.get("name", "NVIDIA H100 80GB HBM3"),
                uuid=g.get("uuid", f"GPU-fake-{i:04d}"),
                readings={**HEALTHY, **g.get("readings", {})},
                unsupported=set(g.get("unsupported", [])),
                errors={k: _error_code(v, k) for k, v in g.get("errors", {}).items()},
                timeline=list(g.get("timeline", [])),
            )
            for i, g in enumerate(scenario.get("gpus", []))
        ]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and callable(getattr(pynvml, name, None)):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return getattr(pynvml, name)

    # -- time --

    def _elapsed(self) -> float:
        return 0.0 if self._start is None else self._clock.now() - self._start

    def _advance(self) -> None:
        now = self._elapsed()
        for gpu in self._gpus:
            while gpu.applied < len(gpu.timeline) and _due(gpu.timeline[gpu.applied], now):
                event = gpu.timeline[gpu.applied]
                gpu.readings.update(event.get("readings", {}))
                gpu.errors.update(
                    {k: _error_code(v, k) for k, v in event.get("errors", {}).items()}
                )
                gpu.lost = gpu.lost or bool(event.get("lost"))
                gpu.gone = gpu.gone or bool(event.get("gone"))
                gpu.applied += 1

    # -- library --

    def nvmlInit(self) -> None:
        if self._scenario.get("driver", True) is False:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        with self._lock:
            if self._start is None:
                self._start = self._clock.now()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake (scenario)"

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._advance()
            return sum(not g.gone for g in self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        with self._lock:
            self._advance()
            present = [g for g in self._gpus if not g.gone]
        if not 0 <= index < len(present):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return present[index]

    def _read(self, handle: _Gpu, reading: str) -> Any:
        with self._lock:
            self._advance()
            if handle.lost or handle.gone:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            if reading in handle.unsupported:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if reading in handle.errors:
                raise pynvml.NVMLError(handle.errors[reading])
            return handle.readings.get(reading)

    def nvmlDeviceGetIndex(self, handle: _Gpu) -> int:
        return handle.index

    def nvmlDeviceGetName(self, handle: _Gpu) -> str:
        if handle.lost or handle.gone:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.name

    def nvmlDeviceGetUUID(self, handle: _Gpu) -> str:
        return handle.uuid

    def nvmlDeviceGetTotalEccErrors(self, handle: _Gpu, error_type: int, counter: int) -> int:
        value = int(self._read(handle, "ecc_uncorrected_volatile"))
        uncorrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return value if uncorrected and counter == pynvml.NVML_VOLATILE_ECC else 0

    def nvmlDeviceGetRemappedRows(self, handle: _Gpu) -> tuple[int, int, int, int]:
        corrected, uncorrected, pending, failed = self._read(handle, "remapped_rows")
        return corrected, uncorrected, pending, failed

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Gpu) -> int:
        return int(self._read(handle, "retired_pages_pending"))

    def nvmlDeviceGetTemperature(self, handle: _Gpu, sensor: int) -> int:
        return int(self._read(handle, "temperature"))

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Gpu, kind: int) -> int:
        return int(self._read(handle, "slowdown_temp"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Gpu) -> int:
        return int(self._read(handle, "clock_reasons"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Gpu) -> int:
        return int(self._read(handle, "pcie")[0])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Gpu) -> int:
        return int(self._read(handle, "pcie")[1])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Gpu) -> int:
        return int(self._read(handle, "pcie")[2])

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Gpu) -> int:
        return int(self._read(handle, "pcie")[3])

    def nvmlDeviceGetNvLinkState(self, handle: _Gpu, link: int) -> int:
        links = self._read(handle, "nvlinks")
        if not 0 <= link < len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(links[link])

    def nvmlDeviceGetFieldValues(self, handle: _Gpu, field_ids: list[int]) -> list[Any]:
        values = []
        for field_id in field_ids:
            if field_id != pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                values.append(SimpleNamespace(nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED))
                continue
            try:
                action = int(self._read(handle, "recovery_action"))
                values.append(SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=action)))
            except pynvml.NVMLError as exc:
                values.append(SimpleNamespace(nvmlReturn=exc.value))
        return values

    # -- events --

    def nvmlEventSetCreate(self) -> list[_Gpu]:
        return []

    def nvmlDeviceRegisterEvents(self, handle: _Gpu, types: int, event_set: list) -> None:
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        event_set.append(handle)

    def nvmlEventSetWait_v2(self, event_set: list[_Gpu], timeout_ms: int) -> Any:
        found: list[Any] = []
        if not self._clock.wait_until(
            lambda: self._next_event(event_set, found), timeout_ms / 1000, 0.05
        ):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return found[0]

    def _next_event(self, event_set: list[_Gpu], found: list[Any]) -> bool:
        """An XID of the scenario that is due and not yet delivered, into found."""
        with self._lock:
            self._advance()
            for gpu in event_set:
                for j, event in enumerate(gpu.timeline[: gpu.applied]):
                    if "xid" in event and j not in gpu.delivered:
                        gpu.delivered.add(j)
                        found.append(
                            SimpleNamespace(
                                device=gpu,
                                eventType=pynvml.nvmlEventTypeXidCriticalError,
                                eventData=event["xid"],
                            )
                        )
                        return True
        return False

    def nvmlEventSetFree(self, event_set: list[_Gpu]) -> None:
        event_set.clear()
