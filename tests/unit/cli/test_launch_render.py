"""cli/main.py's run_launch only renders what the agent's start-up returns: the notes as
they come, one error line, the exit code the outcome carries (no agent runs here)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rtrain.agent.launch import startup
from rtrain.agent.launch.startup import LaunchOutcome, Notify, plan_launch
from rtrain.agent.state import AgentState, RunResult
from rtrain.cli import main
from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.errors import ExitCode


def _plan(tmp_path: Path) -> startup.LaunchPlan:
    script = tmp_path / "train.py"
    script.write_text("")
    return plan_launch(parse_launch_args(["--nproc-per-node=1", str(script)], {}), {})


def _start_up_with(
    monkeypatch: pytest.MonkeyPatch, outcome: LaunchOutcome, notes: tuple[str, ...] = ()
) -> None:
    def fake(raw: dict[str, Any], environ: Mapping[str, str], notify: Notify) -> LaunchOutcome:
        for note in notes:
            notify(note)
        return outcome

    monkeypatch.setattr(startup, "launch", fake)


@pytest.mark.parametrize("state", [AgentState.SUCCEEDED, AgentState.FAILED])
def test_a_run_without_faults_ends_with_its_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    state: AgentState,
) -> None:
    code = ExitCode.SUCCESS if state is AgentState.SUCCEEDED else ExitCode.JOB_FAILED
    result = RunResult(state, code, "max_restarts=0 exhausted", str(tmp_path))
    _start_up_with(monkeypatch, LaunchOutcome(_plan(tmp_path), result=result), ("warning: x",))
    assert main.run_launch(["t.py"], {}) == code
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "rtrain: warning: x"
    failed = "rtrain: error: max_restarts=0 exhausted" in err.splitlines()
    assert failed is (state is AgentState.FAILED)


def test_an_error_is_one_line_and_its_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = startup.UsageError("training script not found: t.py")
    _start_up_with(monkeypatch, LaunchOutcome(error=error))
    assert main.run_launch(["t.py"], {}) == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert (out, err) == ("", "rtrain: error: training script not found: t.py\n")
    assert main._exit_reason[-1] == "training script not found: t.py"


def test_a_bad_flag_never_reaches_the_start_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _start_up_with(monkeypatch, LaunchOutcome(error=startup.UsageError("reached")))
    assert main.run_launch(["--no-such-flag", "t.py"], {}) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-flag" in err and "reached" not in err


def test_a_success_says_so_in_one_line_without_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --events off: no events.jsonl, so no step, wall time or report command to name
    result = RunResult(
        AgentState.SUCCEEDED, ExitCode.SUCCESS, "all workers succeeded", str(tmp_path)
    )
    _start_up_with(monkeypatch, LaunchOutcome(_plan(tmp_path), result=result))
    assert main.run_launch(["t.py"], {}) == ExitCode.SUCCESS
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"rtrain: {tmp_path / 'train.py'} succeeded: no fault"


def test_a_node_without_the_jobs_history_does_not_say_no_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # node 1 of a job that recovered: node 0 read the failure history, node 1 has none,
    # but it ran a second generation: it does not claim that nothing failed
    result = RunResult(
        AgentState.SUCCEEDED, ExitCode.SUCCESS, "all workers succeeded", str(tmp_path), 1
    )
    _start_up_with(monkeypatch, LaunchOutcome(_plan(tmp_path), result=result))
    assert main.run_launch(["t.py"], {}) == ExitCode.SUCCESS
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith("succeeded: 2 generations ran (the faults: node 0's summary)")
