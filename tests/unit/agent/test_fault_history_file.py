"""FaultHistory over torch's real HashStore and a real --checkpoint-dir file, on a fake
clock: seeded from the file once, a charge written to both, a bad file refused (one
line, taken as empty, then replaced whole), the --exclude line under Slurm."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rtrain.agent.health.fault_history import FaultHistory, read_history_file
from rtrain.core.observe.events import Event
from rtrain.core.rendezvous.fault_history import (
    HISTORY_FILE,
    MAX_BYTES,
    FaultEntry,
    HistoryError,
    HistoryPolicy,
    encode_history,
)

from .fakes import FakeClock, memory_store

POLICY = HistoryPolicy(faults=2, window_s=86400.0)


def history(folder: Path, clock: FakeClock, nodes: tuple[str, ...] = ()) -> FaultHistory:
    return FaultHistory(memory_store(), "/h", POLICY, clock, "job", str(folder), nodes)


def test_a_charge_goes_to_the_store_and_the_file(tmp_path: Path, events: list[Event]) -> None:
    clock = FakeClock()
    path = tmp_path / HISTORY_FILE
    path.write_bytes(encode_history((FaultEntry("gpu02", "exit", clock.wall() - 60, "old"),)))
    kept = history(tmp_path, clock, ("gpu01", "gpu02", "gpu03"))
    assert kept.flagged({"gpu02"}) == {}
    kept.record("gpu02", "lost_node")
    assert [e.host for e in read_history_file(str(path))] == ["gpu02", "gpu02"]
    assert kept.flagged({"gpu01", "gpu02"}) == {"gpu02": 2}
    said = {e.name: e.fields for e in events}
    assert said["fault_history"]["faults"] == 2 and said["fault_history"]["standby"] is True
    assert said["slurm_exclude"]["exclude"] == "gpu02"
    clock.sleep(86400.0)  # the window passes
    assert kept.flagged({"gpu02"}) == {}


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\x80\x04\x95pickle", b"x" * (MAX_BYTES + 10)],
    ids=["not-json", "pickle", "oversized"],
)
def test_a_bad_file_is_refused_in_one_line_and_replaced(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / HISTORY_FILE
    path.write_bytes(content)
    with pytest.raises(HistoryError):
        read_history_file(str(path))
    kept = history(tmp_path, FakeClock())
    with caplog.at_level(logging.ERROR):
        assert kept.entries() == ()
        assert kept.entries() == ()
    refused = [r for r in caplog.records if "refusing the fault history" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0].getMessage()
    kept.record("n01", "exit")
    assert [e.host for e in read_history_file(str(path))] == ["n01"]
