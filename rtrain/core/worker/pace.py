"""A worker's pace: how long it computes per logical data rank, and how long it waits in
the all-reduce, measured at rtrain.data_ranks() and rtrain.average_gradients()
(core/worker/shares.py) and written, cumulative, to the pace file next to its
heartbeat file (core/contract/pace.py), which its agent reads (agent/observe/
stragglers.py); and the seconds inside rtrain.snapshot(). One mapped write of 48 bytes
a step; nothing without an agent (no heartbeat file: torchrun, plain python) or with
--stragglers=off.

compute: from data_ranks()'s return to average_gradients()'s entry (the forward and
backward passes of the step's logical ranks); wait: the collective inside
average_gradients (the time the others make it wait, and the transfer).
"""

from __future__ import annotations

import mmap
import os
import struct
import time

from ..contract.environment import HEARTBEAT_FILE
from ..contract.pace import PACE_FORMAT, PACE_SIZE, STRAGGLERS, mode, pace_path


class _Pace:
    def __init__(self) -> None:
        self.path: str | None = None
        self.map: mmap.mmap | None = None
        self.seq = 0
        self.steps = 0
        self.logical = 0
        self.compute_s = 0.0
        self.wait_s = 0.0
        self.snapshot_s = 0.0
        self.began: float | None = None  # data_ranks()'s return this step
        self.held = 0
        self.computed: float | None = None  # this step's compute, at average_gradients()

    def open(self) -> bool:
        """The pace file of this generation's heartbeat file, opened (a new one after a
        fork or a repair: the figures start again); False without one."""
        beat = os.environ.get(HEARTBEAT_FILE)
        if not beat or mode(os.environ.get(STRAGGLERS)) == "off":
            return False
        path = pace_path(beat)
        if path == self.path:
            return self.map is not None
        self.path, self.map = path, None
        self.seq = self.steps = self.logical = 0
        self.compute_s = self.wait_s = self.snapshot_s = 0.0
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            os.ftruncate(fd, PACE_SIZE)
            self.map = mmap.mmap(fd, PACE_SIZE)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def write(self) -> None:
        if self.map is None:
            return
        self.seq += 1  # odd: a write under way
        struct.pack_into("<Q", self.map, 0, self.seq)
        figures = (self.steps, self.logical, self.compute_s, self.wait_s, self.snapshot_s)
        struct.pack_into(PACE_FORMAT, self.map, 0, self.seq, *figures)
        self.seq += 1
        struct.pack_into("<Q", self.map, 0, self.seq)


_pace = _Pace()


def begin(held: int) -> None:
    """data_ranks() returns `held` logical ranks: the step's compute starts."""
    _pace.began, _pace.held, _pace.computed = time.perf_counter(), held, None


def computed() -> None:
    """average_gradients() entered: the step's compute is done."""
    if _pace.began is not None:
        _pace.computed = time.perf_counter() - _pace.began
        _pace.began = None


def waited(seconds: float) -> None:
    """average_gradients()'s collective took this long: the step is counted."""
    if _pace.computed is None:
        return
    compute, _pace.computed = _pace.computed, None
    if not _pace.open():
        return
    _pace.steps += 1
    _pace.logical += _pace.held
    _pace.compute_s += compute
    _pace.wait_s += seconds
    _pace.write()


def snapshotted(seconds: float) -> None:
    """rtrain.snapshot() took this long: the time the step spent keeping its state
    (the agent's `snapshot_overhead` in the wall time by cause)."""
    if not _pace.open():
        return
    _pace.snapshot_s += seconds
    _pace.write()
