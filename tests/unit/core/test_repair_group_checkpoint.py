"""rtrain.repairable (core/worker/repair/repairable.py) and DCP's CheckpointException, a
BaseException that dcp.save and dcp.load raise on every rank when one rank's part
failed (a released collective's error included): with a repair asked, the worker is
kept (parked, then called again in the next generation), as after a released
collective's RuntimeError; with none, it fails as today; KeyboardInterrupt and
SystemExit still end the process. The test plays the agent through the control files
(core/contract/repair_files.py); the save is torch's real dcp.save, in one process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

import rtrain
from rtrain.core.contract.repair_files import (
    REPAIR_DIR,
    REPAIR_WAIT,
    REQUEST_FILE,
    RESUME_FILE,
    RESUME_WAIT,
    Resume,
    encode_request,
    encode_resume,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class ReleasedWriter(FileSystemWriter):
    """A storage writer whose write fails as one in a released group does, the agent's
    request for a repair landing as it fails (when `control` is given)."""

    def __init__(self, path: Path, control: Path | None) -> None:
        super().__init__(str(path))
        self.control = control

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        if self.control is not None:
            (self.control / REQUEST_FILE).write_bytes(encode_request(0))
        raise RuntimeError("Connection closed by peer")


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "control"
    folder.mkdir()
    monkeypatch.setenv(REPAIR_DIR, str(folder))
    monkeypatch.setenv(REPAIR_WAIT, "0.5")
    monkeypatch.setenv(RESUME_WAIT, "10")
    monkeypatch.setenv("RTRAIN_GENERATION", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # no group: the loop alone
    return folder


def _save(tmp_path: Path, control: Path | None) -> None:
    dcp.save({"w": torch.ones(3)}, storage_writer=ReleasedWriter(tmp_path / "ckpt", control))


def test_a_checkpoint_exception_under_a_repair_keeps_the_worker(
    tmp_path: Path, control: Path
) -> None:
    (control / RESUME_FILE).write_bytes(
        encode_resume(Resume(1, os.getpid(), {"RTRAIN_GENERATION": "1"}))
    )
    calls: list[int] = []

    @rtrain.repairable
    def train() -> str:
        calls.append(rtrain.repairs())
        if len(calls) == 1:
            _save(tmp_path, control)  # raises CheckpointException (before: the worker died)
        return "done"

    assert train() == "done"
    assert calls == [0, 1]  # the same process, called again in generation 1


def test_a_checkpoint_exception_with_no_repair_asked_fails_the_worker(
    tmp_path: Path, control: Path
) -> None:
    @rtrain.repairable
    def train() -> None:
        _save(tmp_path, None)

    with pytest.raises(CheckpointException):
        train()


@pytest.mark.parametrize("ending", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_or_exit_ends_the_worker_even_under_a_repair(
    control: Path, ending: type[BaseException]
) -> None:
    (control / REQUEST_FILE).write_bytes(encode_request(0))

    @rtrain.repairable
    def train() -> None:
        raise ending()

    with pytest.raises(ending):
        train()
