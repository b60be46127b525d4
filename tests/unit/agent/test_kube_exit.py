"""The container's termination message (agent/kube/termination_log.py, issue 37 item 4)
and the small-/dev/shm warning's budget logic (agent/kube/shm.py, item 5)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from rtrain.agent.kube.shm import MiB, check_shm, shm_warning, slot_budget
from rtrain.agent.kube.termination_log import (
    LIMIT_BYTES,
    PATH_VARIABLE,
    message_for,
    write_termination_log,
)
from rtrain.core.errors import ExitCode


def test_a_non_zero_exit_writes_its_one_line_reason(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    env = {PATH_VARIABLE: str(path)}
    assert write_termination_log(75, "no rendezvous store answered\nat x", env) == str(path)
    assert path.read_text() == ("rtrain: exit 75 (TEMPFAIL): no rendezvous store answered at x\n")
    assert write_termination_log(ExitCode.USAGE, "--nnodes: bad", env) == str(path)
    assert path.read_text().startswith("rtrain: exit 64 (USAGE): --nnodes: bad")


def test_exit_0_writes_nothing_and_a_missing_default_file_is_not_made(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert write_termination_log(0, "all workers succeeded", {PATH_VARIABLE: str(path)}) is None
    assert not path.exists()
    if not os.path.exists("/dev/termination-log"):  # not in a pod: never created in /dev
        assert write_termination_log(1, "failed", {}) is None
        assert not os.path.exists("/dev/termination-log")


def test_the_message_stays_within_the_kubelets_limit() -> None:
    line = message_for(143, "x" * 10_000)
    assert line.startswith("rtrain: exit 143 (signal 15): x")
    assert len(line.encode()) <= LIMIT_BYTES and line.endswith("...\n")


def test_a_container_default_shm_is_a_warning_with_the_fix() -> None:
    """64 MiB (a container's default): half is the budget, 6.4 MiB a slot for one worker."""
    message = shm_warning("/dev/shm", 64 * MiB, None, nproc=1, copies=2)
    assert message is not None
    assert "32.0 MiB" in message and "6.4 MiB a snapshot slot" in message
    assert "emptyDir" in message and "medium: Memory" in message
    assert slot_budget(32 * MiB, 1, 2) == 32 * MiB // 5


def test_a_node_sized_shm_or_a_sized_budget_is_quiet() -> None:
    assert shm_warning("/dev/shm", 64 * 1024 * MiB, None, nproc=8, copies=2) is None
    assert shm_warning("/dev/shm", 64 * MiB, 16 * MiB, nproc=1, copies=2) is None
    over = shm_warning("/dev/shm", 64 * MiB, 1024 * MiB, nproc=1, copies=2)
    assert over is not None and "more than /dev/shm holds" in over


def test_check_shm_reads_the_folder_snapshots_live_in(tmp_path: Path) -> None:
    """The seam: a statvfs-like reader (a 64 MiB tmpfs is mounted for real in
    tests/integration/test_kubernetes_faults.py where namespaces are allowed)."""
    seen: list[str] = []

    def statvfs(folder: str) -> SimpleNamespace:
        seen.append(folder)
        return SimpleNamespace(f_frsize=4096, f_blocks=64 * MiB // 4096)

    env = {"RTRAIN_RUNTIME_DIR": str(tmp_path)}
    message = check_shm(None, 2, 2, env, statvfs)
    assert seen == [str(tmp_path)]
    assert message is not None and "3.2 MiB a snapshot slot for 2 worker(s)" in message
