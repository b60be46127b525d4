"""The agent's clock: every agent component takes a core.clock.Clock, this one by
default, so that a test drives it with a fake clock and no real sleep."""

from __future__ import annotations

import time

from ..core.clock import Clock

SYSTEM_CLOCK = Clock(now=time.monotonic, sleep=time.sleep, epoch=time.time)
