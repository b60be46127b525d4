"""Reading GPUs through NVML: samples for core.health.gpu_health, and XID events.

`open_nvml` gives the real `pynvml` (package nvidia-ml-py) or, when RTRAIN_FAKE_NVML
names a scenario file, agent.fake_nvml's stand-in with the same functions; nothing
below knows which. Every NVML call is guarded: a reading NVML refuses is Unreadable
(the check becomes UNKNOWN), one the GPU lacks is NOT_SUPPORTED, and
NVML_ERROR_GPU_IS_LOST from any call marks the GPU lost. Nothing here raises past
`open_nvml`: a flaky driver must never take the agent down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...core.clock import Clock
from ...core.errors import RtrainError
from ...core.health.gpu_health import NOT_SUPPORTED, GpuSample, Unreadable, XidEvent
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

FAKE_NVML = "RTRAIN_FAKE_NVML"
XID_WAIT_MS = 500


class NvmlUnavailable(RtrainError):
    """No NVIDIA driver (or no NVML) on this node: nothing to check."""


def open_nvml(environ: Mapping[str, str] | None = None, fake: str | None = None) -> Any:
    """An initialised NVML: the fake when a scenario is named, else pynvml."""
    environ = os.environ if environ is None else environ
    scenario = fake or environ.get(FAKE_NVML)
    if scenario:
        from .fake_nvml import FakeNvml, load_scenario

        nvml: Any = FakeNvml(load_scenario(scenario))
    else:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            raise NvmlUnavailable("NVML is not installed (pip install nvidia-ml-py)") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(
            f"no NVIDIA driver on this node: NVML could not start ({exc})"
        ) from None
    return nvml


def nvml_missing(environ: Mapping[str, str] | None = None) -> str | None:
    """Why NVML cannot start on this node (the agent then runs no GPU checks), or None
    where it can: what `rtrain launch --dry-run` says of the GPU checks."""
    try:
        nvml = open_nvml(environ)
    except NvmlUnavailable as exc:
        return str(exc)
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()
    return None


class NvmlReader:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def count(self) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as exc:
            logger.warning("cannot count GPUs: %s", exc)
            return 0

    def uuid_of(self, index: int) -> str:
        try:
            return _text(self.nvml.nvmlDeviceGetUUID(self.nvml.nvmlDeviceGetHandleByIndex(index)))
        except Exception:  # a lost GPU: its UUID is only a label here
            return "?"

    def sample_all(self) -> list[GpuSample]:
        return [self.sample(i) for i in range(self.count())]

    def sample(self, index: int) -> GpuSample:
        nvml = self.nvml
        sample = GpuSample(index)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            sample.lost = True  # counted a moment ago, gone now: off the bus
            return sample

        def read(fn: Callable[[], Any]) -> Any:
            if sample.lost:
                return NOT_SUPPORTED
            try:
                return fn()
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                    sample.lost = True
                    return NOT_SUPPORTED
                if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                    return NOT_SUPPORTED
                return Unreadable(str(exc))
            except Exception as exc:  # a broken binding must not take the agent down
                return Unreadable(f"{type(exc).__name__}: {exc}")

        sample.name = _text(read(lambda: nvml.nvmlDeviceGetName(handle)))
        sample.uuid = _text(read(lambda: nvml.nvmlDeviceGetUUID(handle)))
        r = sample.readings
        r["ecc_uncorrected_volatile"] = read(
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        )
        r["remapped_rows"] = read(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        r["retired_pages_pending"] = read(
            lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        )
        r["temperature"] = read(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        )
        r["slowdown_temp"] = read(
            lambda: nvml.nvmlDeviceGetTemperatureThreshold(
                handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            )
        )
        r["clock_reasons"] = read(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        r["pcie"] = read(
            lambda: (
                nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                nvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
                nvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
            )
        )
        r["nvlinks"] = read(lambda: self._nvlinks(handle))
        r["recovery_action"] = read(lambda: self._recovery_action(handle))
        return sample

    def _nvlinks(self, handle: Any) -> list[int] | str:
        """The state of each link the GPU has; links past the last one answer
        INVALID_ARGUMENT or NOT_SUPPORTED, which ends the list."""
        nvml = self.nvml
        states = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                states.append(int(nvml.nvmlDeviceGetNvLinkState(handle, link)))
            except nvml.NVMLError as exc:
                if exc.value in (nvml.NVML_ERROR_INVALID_ARGUMENT, nvml.NVML_ERROR_NOT_SUPPORTED):
                    break
                raise
        return states or NOT_SUPPORTED

    def _recovery_action(self, handle: Any) -> int:
        nvml = self.nvml
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if value.nvmlReturn != 0:
            raise nvml.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) and value != NOT_SUPPORTED else "?"


def collect_xids(nvml: Any, gpus: int, wait: float, clock: Clock = SYSTEM_CLOCK) -> list[XidEvent]:
    """The XID events that arrive within `wait` seconds (NVML keeps no history: on a
    real GPU only what happens while this runs; a fake scenario replays its own).
    clock: the deadline (the driver's wait blocks for what is left), events' times."""
    event_set = nvml.nvmlEventSetCreate()
    try:
        for index in range(gpus):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError:
                continue  # a lost GPU is reported by its sample
        events: list[XidEvent] = []
        deadline = clock.now() + wait
        while True:
            left_ms = max(int((deadline - clock.now()) * 1000), 0)
            try:
                event = nvml.nvmlEventSetWait_v2(event_set, left_ms)
            except nvml.NVMLError:
                return events  # timeout (or no event support): nothing more
            if event.eventType == nvml.nvmlEventTypeXidCriticalError:
                try:
                    gpu = int(nvml.nvmlDeviceGetIndex(event.device))
                except nvml.NVMLError:
                    gpu = -1
                events.append(XidEvent(clock.wall(), gpu, int(event.eventData)))
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(event_set)


class XidListener:
    """Waits for critical XID events on every GPU, on its own thread; `take()` hands
    over what arrived since the last call."""

    def __init__(self, nvml: Any, gpus: int, wall: Callable[[], float] = SYSTEM_CLOCK.wall) -> None:
        """wall: the events' times (the agent clock's wall)."""
        self._nvml = nvml
        self._wall = wall
        self._events: list[XidEvent] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._set = nvml.nvmlEventSetCreate()
        self._handles: list[tuple[Any, int]] = []
        for index in range(gpus):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
                self._handles.append((handle, index))
            except nvml.NVMLError as exc:
                logger.warning("no XID events from GPU %d: %s", index, exc)
        self._thread = threading.Thread(target=self._run, name="rtrain-xid", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml = self._nvml
        failures = 0
        while not self._closed.is_set():
            try:
                event = nvml.nvmlEventSetWait_v2(self._set, XID_WAIT_MS)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                failures += 1
                if failures == 1:
                    logger.warning("waiting for XID events failed: %s", exc)
                if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    logger.warning("no XID events on this driver; the periodic checks go on")
                    return
                self._closed.wait(min(2.0**failures, 60.0))  # a flaky driver: back off
                continue
            failures = 0
            if event.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = next((i for h, i in self._handles if h == event.device), -1)
            if gpu < 0:
                with contextlib.suppress(nvml.NVMLError):
                    gpu = int(nvml.nvmlDeviceGetIndex(event.device))
            with self._lock:
                self._events.append(XidEvent(self._wall(), gpu, int(event.eventData)))

    def take(self) -> list[XidEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2 * XID_WAIT_MS / 1000)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlEventSetFree(self._set)
