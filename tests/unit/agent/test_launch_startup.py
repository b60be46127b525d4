"""agent/launch/startup.py without the command line and without workers: dry runs, bad
input (one RtrainError, exit code 64), the Slurm path over a fake environment, and the
notes said before the agent starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rtrain.agent.launch import startup
from rtrain.agent.launch.startup import OMP_NOTE, launch, plan_launch, prepare
from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.errors import ExitCode, UsageError


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


@pytest.fixture
def notes() -> list[str]:
    return []


def _launch(argv: list[str], environ: dict[str, str], notes: list[str]) -> startup.LaunchOutcome:
    return launch(parse_launch_args(argv, environ), environ, notes.append)


def test_a_dry_run_resolves_everything_and_starts_nothing(script: str, notes: list[str]) -> None:
    argv = ["--dry-run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=3", script]
    outcome = _launch([*argv, "--master-addr=n0.invalid"], {}, notes)
    assert outcome.error is None and outcome.result is None and outcome.plan is not None
    assert outcome.exit_code == ExitCode.SUCCESS and not outcome.succeeded
    plan = outcome.plan
    assert plan.dry_run and plan.nproc == 3 and plan.took == []
    assert plan.spec.entrypoint.target == script and plan.spec.slurm is None
    assert outcome.store_host is not None and outcome.store_host.hosts is False
    assert "node rank 0 (this is 1)" in outcome.store_host.reason
    assert notes == []  # a dry run says nothing before its tables


def test_over_etcd_no_node_hosts_the_store(script: str, notes: list[str]) -> None:
    argv = ["--dry-run", "--rdzv-backend=etcd", "--rdzv-endpoint=127.0.0.1:2379", script]
    outcome = _launch(argv, {}, notes)
    assert outcome.error is None and outcome.store_host is None


@pytest.mark.parametrize(
    ("argv", "environ", "fragment"),
    [
        (["missing_script.py"], {}, "training script not found: missing_script.py"),
        (["--nproc-per-node", "\u00b2", "{script}"], {}, "--nproc-per-node"),
        (["--recycle-profile=/no/such/profile.json", "{script}"], {}, "--recycle-profile"),
        (["{script}"], {"SLURM_JOB_ID": "7"}, "SLURM_JOB_NODELIST is missing"),
        (
            ["{script}"],
            {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "4"},
            "one task per node",
        ),
    ],
)
def test_bad_input_is_one_usage_error(
    script: str, notes: list[str], argv: list[str], environ: dict[str, str], fragment: str
) -> None:
    argv = [arg.replace("{script}", script) for arg in argv]
    outcome = _launch(["--dry-run", *argv], environ, notes)
    assert isinstance(outcome.error, UsageError), outcome
    assert fragment in str(outcome.error)
    assert outcome.exit_code == ExitCode.USAGE == 64
    assert outcome.plan is None and outcome.result is None


def test_slurm_fills_what_the_flags_left(
    script: str, monkeypatch: pytest.MonkeyPatch, notes: list[str]
) -> None:
    """The second node of a two-node step: the rendezvous on the first node's address,
    the run id the job's, the store hosted by the first node."""
    addresses = {"n1": "10.0.0.1", "n2": "10.0.0.2"}
    monkeypatch.setattr(startup, "resolve_node_address", addresses.__getitem__)
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "n2",
    }
    outcome = _launch(["--dry-run", "--nproc-per-node=1", script], environ, notes)
    assert outcome.error is None and outcome.plan is not None
    spec, took = outcome.plan.spec, outcome.plan.took
    assert spec.slurm is not None and spec.slurm.job_id == 7 and spec.slurm.node_id == 1
    assert spec.rdzv.backend == "c10d" and spec.rdzv.host == "10.0.0.1"
    assert spec.rdzv.run_id == "7" and spec.local_addr == "10.0.0.2"
    assert spec.nodes.min_nodes == 1 and spec.nodes.max_nodes == 2
    assert "this node's address 10.0.0.2" in took and "2 nodes (n1,n2)" in took
    assert outcome.store_host is not None and outcome.store_host.hosts is False


def test_flags_given_win_over_slurm(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "resolve_node_address", lambda name: name)
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}
    raw = parse_launch_args(["--standalone", "--nproc-per-node=1", script], environ)
    plan = plan_launch(raw, environ)
    assert plan.spec.standalone and plan.spec.rdzv.run_id != "7"
    assert plan.took == ["rendezvous from the flags", "this node rank 0"]
    assert "slurm" not in raw  # the caller's values are not changed


def test_the_notes_come_before_the_agent(
    script: str, monkeypatch: pytest.MonkeyPatch, notes: list[str]
) -> None:
    monkeypatch.setattr(startup.log, "configure", lambda **_: None)
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    argv = ["--numa-binding=node", "--nproc-per-node=2", script]
    plan = plan_launch(parse_launch_args(argv, {}), {})
    prepare(plan, {}, notes.append)
    assert notes == [
        "warning: --numa-binding is accepted for compatibility but not acted on",
        OMP_NOTE,
    ]
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "FATAL"
    notes.clear()
    prepare(plan, {"OMP_NUM_THREADS": "4"}, notes.append)
    assert notes == ["warning: --numa-binding is accepted for compatibility but not acted on"]


def test_an_agent_that_cannot_open_is_an_error_with_the_plan(
    script: str, monkeypatch: pytest.MonkeyPatch, notes: list[str]
) -> None:
    """--drain-on-fault outside Slurm: the health guard refuses before any worker starts."""
    monkeypatch.setattr(startup.log, "configure", lambda **_: None)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "FATAL")
    argv = ["--drain-on-fault", "--health-interval=5", "--nproc-per-node=1", script]
    outcome = _launch(argv, {}, notes)
    assert isinstance(outcome.error, UsageError) and "--drain needs Slurm" in str(outcome.error)
    assert outcome.exit_code == ExitCode.USAGE
    assert outcome.plan is not None and outcome.result is None
