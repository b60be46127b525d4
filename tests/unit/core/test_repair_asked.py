"""A snapshot that waits for its last step's replication ends when the agent asks for
a repair in place (core/worker/repair/asked.py), in one worker, the test playing the
agent (which never marks the slot replicated: its peer is gone)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rtrain.core.snapshots.format import SnapshotError
from rtrain.core.worker.repair.asked import ASKED
from rtrain.core.worker.snapshots import snapshot


@pytest.fixture
def asked():
    ASKED.clear()
    yield ASKED
    ASKED.clear()


def test_a_repair_request_ends_a_snapshots_wait_for_its_replication(
    slot_dir: str, monkeypatch: pytest.MonkeyPatch, asked: threading.Event
) -> None:
    # Before: the wait went on for WAIT_LIMIT_S (300 s); measured in
    # test_repair_node_faults[restoring], rank 0 waited on the lost standby's
    # replication, did not park within 5 s and was stopped (a failed repair).
    monkeypatch.setenv("RTRAIN_SNAPSHOT_POLICY", "wait")
    state = {"w": torch.ones(16)}
    snapshot(state, 1)  # nothing before it to wait for
    ended: list[BaseException] = []

    def second() -> None:
        try:
            snapshot(state, 2)  # waits: step 1 is never marked replicated
        except SnapshotError as exc:
            ended.append(exc)

    waiting = threading.Thread(target=second, daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # it waits, as it should while no repair is asked
    started = time.monotonic()
    asked.set()  # as repair.py's watcher does on the agent's request
    waiting.join(10)
    assert not waiting.is_alive() and time.monotonic() - started < 5
    assert "a repair came while the snapshot of step 1 replicated" in str(ended[0])
