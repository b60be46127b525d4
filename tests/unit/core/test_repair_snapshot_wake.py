"""A worker repaired in place snapshots into each new generation's folder: the old
generation's wake FIFO (core/snapshots/format.py, WAKE_FIFO) is closed when it moves
on. Before, each repair kept one more descriptor (measured: 19 -> 37 after 18 repairs,
tests/integration/test_repair_soak.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rtrain.core.snapshots.format import WAKE_FIFO
from rtrain.core.worker import snapshots as snapshot_api
from rtrain.core.worker.snapshots import snapshot


def test_moving_to_a_new_generation_closes_the_old_wake_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(snapshot_api, "_slots", None)
    readers, counts = [], []
    try:
        for generation in range(4):
            folder = tmp_path / f"gen{generation}"
            folder.mkdir()
            os.mkfifo(folder / WAKE_FIFO)
            # the agent's read end: without a reader the worker cannot open the FIFO
            readers.append(os.open(folder / WAKE_FIFO, os.O_RDONLY | os.O_NONBLOCK))
            monkeypatch.setenv(snapshot_api.SNAPSHOT_DIR, str(folder))
            assert snapshot({"w": torch.zeros(16)}, 0)
            counts.append(len(os.listdir("/proc/self/fd")) - len(readers))
        assert counts[1:] == counts[:-1], counts
    finally:
        if snapshot_api._slots is not None:
            snapshot_api._slots.close()
        for fd in readers:
            os.close(fd)
