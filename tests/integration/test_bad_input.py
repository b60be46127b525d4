"""Bad input: one clear line on stderr, a documented non-zero exit code, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.integration.helpers import PROBE, RTRAIN, HeldPort, error_lines, probe_env, run

pytestmark = pytest.mark.integration

USAGE, TEMPFAIL = 64, 75


def _c10d(port: int, conf: str, nnodes: int = 2, run_id: str = "none") -> list[str]:
    return [
        f"--nnodes={nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-id={run_id}",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-conf={conf}",
        PROBE,
    ]


def _assert_one_clear_error(result, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["missing_script.py"], "training script not found: missing_script.py"),
        (["--nnodes", "a:b", PROBE], "--nnodes"),
        (["--nnodes", "3:2", PROBE], "MIN must not exceed MAX"),
        (["--nnodes", "0", PROBE], "at least 1"),
        (["--rdzv-backend", "carrier-pigeon", PROBE], "unknown backend"),
        (["--no-such-flag", PROBE], "unrecognized arguments"),
        (["--no-python", "definitely-not-a-program-xyz"], "not an executable on PATH"),
    ],
)
def test_usage_errors(tmp_path, argv, fragment):
    _assert_one_clear_error(run([*RTRAIN, *argv], probe_env(tmp_path), timeout=30), USAGE, fragment)


# The audit's classes of malformed input that used to slip past the one-line rule.
AUDIT_CASES = [
    (["--nproc-per-node", "\u0662", PROBE], {}, "--nproc-per-node"),  # Arabic-Indic 2
    (["--nproc-per-node", "\u00b2", PROBE], {}, "--nproc-per-node"),  # superscript 2
    (["--nproc-per-node", "99999999999999999999", PROBE], {}, "--nproc-per-node"),
    (["--snapshot-memory", "inf", PROBE], {}, "--snapshot-memory"),
    (["--snapshot-memory", "1e400", PROBE], {}, "--snapshot-memory"),
    (["--monitor-interval", "inf", PROBE], {}, "--monitor-interval"),
    (["--max-restarts", "\uff13", PROBE], {}, "--max-restarts"),  # full-width 3
    (["--rdzv-backend=c10d", "--rdzv-endpoint=[::1", PROBE], {}, "--rdzv-endpoint"),
    (["--rdzv-backend=c10d", "--rdzv-endpoint=[::1]x9", PROBE], {}, "--rdzv-endpoint"),
    (["--rdzv-backend=c10d", "--rdzv-endpoint=host:1:2", PROBE], {}, "too many ':'"),
    (["--rdzv-backend=c10d", "--rdzv-endpoint=ho st:29400", PROBE], {}, "--rdzv-endpoint"),
    (["--rdzv-conf=join_timeout=nan", PROBE], {}, "join_timeout"),
    (["--rdzv-conf=read_timeout=inf", PROBE], {}, "read_timeout"),
    (["--rdzv-conf=heartbeat_timeout=1e308", PROBE], {}, "heartbeat_timeout"),
    (["--log-dir=/proc/rtrain-logs", PROBE], {}, "--log-dir /proc/rtrain-logs"),
    ([PROBE], {"PET_NPROC_PER_NODE": "\u0663"}, "--nproc-per-node"),
    (
        [PROBE],
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "x"},
        "SLURM_NTASKS_PER_NODE",
    ),
    (
        [PROBE],
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[0-9999][0-9999]"},
        "more than 65536 hosts",
    ),
]


@pytest.mark.parametrize(("argv", "env", "fragment"), AUDIT_CASES)
def test_malformed_values_are_one_line_and_64(tmp_path, argv, env, fragment):
    result = run([*RTRAIN, "--dry-run", *argv], probe_env(tmp_path, **env), timeout=30)
    _assert_one_clear_error(result, USAGE, fragment)


def test_a_plan_too_large_to_make_is_refused_with_the_limit(tmp_path):
    cmd = [sys.executable, "-m", "rtrain.cli.main", "plan", "--dp=64", "--pp=16"]
    result = run([*cmd, "--microbatches=64", "--fail=1:2"], probe_env(tmp_path), timeout=30)
    _assert_one_clear_error(result, USAGE, "more than rtrain plan handles (16384")


def test_non_executable_with_no_python(tmp_path):
    script = tmp_path / "not_executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    result = run([*RTRAIN, "--no-python", str(script)], probe_env(tmp_path), timeout=30)
    _assert_one_clear_error(result, USAGE, "is not executable")


def test_unreachable_endpoint_is_bounded_by_join_timeout(tmp_path):
    with HeldPort() as held:  # nothing listens there: connections are refused
        port = held.port
        argv = _c10d(port, "is_host=false,join_timeout=3")
        started = time.monotonic()
        result = run([*RTRAIN, *argv], probe_env(tmp_path), timeout=60)
    _assert_one_clear_error(result, TEMPFAIL, f"127.0.0.1:{port}")
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("conf", "fragment"),
    [("join_timeout=3", "127.0.0.1:{port}"), ("is_host=true", "in use")],
    ids=["joins-as-client", "told-to-host"],
)
def test_busy_port_held_by_another_program(tmp_path, conf, fragment):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run([*RTRAIN, *_c10d(port, conf)], probe_env(tmp_path), timeout=60)
    _assert_one_clear_error(result, TEMPFAIL, fragment.format(port=port))


def test_too_few_nodes_times_out(tmp_path):
    argv = _c10d(0, "join_timeout=2")  # the node hosts the store on a port it binds itself
    result = run([*RTRAIN, *argv], probe_env(tmp_path), timeout=60)
    _assert_one_clear_error(result, TEMPFAIL, "1 of at least 2 nodes joined")


def test_garbage_in_the_store_is_refused(tmp_path):
    """A foreign value under the job's keys ends the join with a clear error, not a crash."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set("/rtrain/garbage/round", "not a number")
    argv = _c10d(store.port, "is_host=false,join_timeout=5", nnodes=1, run_id="garbage")
    result = run([*RTRAIN, *argv], probe_env(tmp_path), timeout=60)
    _assert_one_clear_error(result, TEMPFAIL, "round counter")


@pytest.mark.parametrize(
    ("slurm", "fragment"),
    [
        ({"SLURM_JOB_ID": "x1", "SLURM_JOB_NODELIST": "n[1-2]"}, "SLURM_JOB_ID='x1'"),
        (
            {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NNODES": "2"},
            "SLURM_NNODES=2 but SLURM_JOB_NODELIST='n[1-3]' names 3 nodes",
        ),
        ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST='n[1-'"),
        ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is missing"),
    ],
)
def test_a_contradictory_slurm_environment_is_refused(tmp_path, slurm, fragment):
    env = {k: v for k, v in probe_env(tmp_path).items() if not k.startswith("SLURM")}
    result = run([*RTRAIN, "--nproc-per-node=1", PROBE], {**env, **slurm})
    _assert_one_clear_error(result, USAGE, fragment)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "--recycle-profile"),
        ("{not json", "--recycle-profile"),
        ('{"microbatches": 2, "forward": 1}', "backward_input is missing"),
    ],
)
def test_a_bad_recycle_profile_is_refused(tmp_path, content, fragment):
    profile = tmp_path / "profile.json"
    if content is not None:
        profile.write_text(content)
    result = run(
        [*RTRAIN, "--standalone", f"--recycle-profile={profile}", PROBE], probe_env(tmp_path)
    )
    _assert_one_clear_error(result, USAGE, fragment)


def test_version_is_the_installed_packages() -> None:
    from importlib.metadata import version

    result = subprocess.run(
        [sys.executable, "-m", "rtrain.cli.main", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"rtrain {version('rtrain')}"
