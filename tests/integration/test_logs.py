"""torchrun's log layout, redirects, tee prefixes and the local-ranks filter."""

from __future__ import annotations

import pytest

from tests.integration.helpers import PROBE, RTRAIN, probe_env, run

pytestmark = pytest.mark.integration


def test_tee_writes_files_and_prefixed_console(tmp_path):
    logs = tmp_path / "logs"
    result = run(
        [*RTRAIN, "--nproc-per-node=2", f"--log-dir={logs}", "-t", "3", PROBE], probe_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = list(logs.iterdir())
    for rank in (0, 1):
        folder = run_dir / "attempt_0" / str(rank)
        assert f"probe rank {rank} generation 0 finished" in (folder / "stdout.log").read_text()
        assert (folder / "stderr.log").exists()
        assert f"[default{rank}]:probe rank {rank} generation 0 finished 3 steps" in result.stdout


def test_redirect_keeps_output_off_the_console(tmp_path):
    logs = tmp_path / "logs"
    result = run(
        [*RTRAIN, "--nproc-per-node=2", f"--log-dir={logs}", "-r", "0:1", PROBE],
        probe_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "probe rank 0" not in result.stdout
    assert "probe rank 1 generation 0 finished" in result.stdout
    (run_dir,) = list(logs.iterdir())
    assert "probe rank 0" in (run_dir / "attempt_0" / "0" / "stdout.log").read_text()


def test_local_ranks_filter(tmp_path):
    logs = tmp_path / "logs"
    cmd = [*RTRAIN, "--nproc-per-node=2", f"--log-dir={logs}", "--local-ranks-filter=1", PROBE]
    result = run(cmd, probe_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "probe rank 1" in result.stdout and "probe rank 0" not in result.stdout
    (run_dir,) = list(logs.iterdir())
    assert "probe rank 0" in (run_dir / "attempt_0" / "0" / "stdout.log").read_text()
