"""A slow rank's GPU as NVML sees it, for its `straggler` event: the SM clock against
its maximum, the temperature and the clock event (throttle) reasons. None where there
is no NVML (a CPU node, no driver); a field NVML refuses is None. Asked once per
straggler found, never per step: a driver call may block on a sick GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from .nvml_reader import NvmlUnavailable, open_nvml


def gpu_clocks(index: int) -> dict[str, Any] | None:
    """GPU `index`'s clocks, temperature and throttle reasons; None without NVML."""
    try:
        nvml = open_nvml()
    except NvmlUnavailable:
        return None
    try:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            return None

        def read(fn: Callable[[], Any]) -> Any:
            try:
                value = fn()
            except (nvml.NVMLError, AttributeError):
                return None
            return int(value) if isinstance(value, int) else None

        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        return {
            "gpu": index,
            "sm_clock_mhz": read(lambda: nvml.nvmlDeviceGetClockInfo(handle, sm)),
            "sm_clock_max_mhz": read(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm)),
            "temperature_c": read(
                lambda: nvml.nvmlDeviceGetTemperature(
                    handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
                )
            ),
            "throttle_reasons": None if reasons is None else read(lambda: reasons(handle)),
        }
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
