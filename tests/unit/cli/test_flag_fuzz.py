"""Fuzzed command lines and environments: every input ends in a launch spec within
sane bounds or in one UsageError line (exit 64) -- never a traceback, never a hang."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.config import flag_values
from rtrain.core.config.launch_spec import LaunchSpec, build_launch_spec
from rtrain.core.config.rdzv_conf import RDZV_CONF_DEFAULTS
from rtrain.core.config.settings import SETTINGS
from rtrain.core.config.slurm.env import read_slurm_job
from rtrain.core.errors import UsageError
from tests.integration.helpers import PROBE

# Values of the kinds the audit tried: plain, huge, non-ASCII digits, non-finite, junk.
VALUES = st.one_of(
    st.integers(-3, 70000).map(str),
    st.integers(10**9, 10**40).map(str),
    st.sampled_from(["\u0662", "\u00b2", "\uff13", "1_000", " 2 ", "+3", "-0", "0x10"]),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e400", "0.0", "1.5", "2G", "8E"]),
    st.sampled_from(["[::1]", "[::1", "::1", "h:1:2", "[::1]:x", "a b:1", "h:", ":9", "h:99999"]),
    st.text(max_size=10),
)
# Every flag that takes a value, from the settings table: a new row is fuzzed as well.
FLAGS = [s.flag for s in SETTINGS if not s.switch]
CONF_KEYS = [*RDZV_CONF_DEFAULTS, "is_host", "store_type", "bogus"]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    flags = draw(st.lists(st.sampled_from(FLAGS), max_size=4))
    argv = [f"{flag}={draw(VALUES)}" for flag in flags]
    if draw(st.booleans()):
        pairs = draw(st.lists(st.tuples(st.sampled_from(CONF_KEYS), VALUES), max_size=3))
        argv.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in pairs))
    if draw(st.booleans()):
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={draw(VALUES)}"]
    return [*argv, PROBE]


def spec_or_usage_error(argv: list[str], environ: dict[str, str]) -> LaunchSpec | None:
    try:
        return build_launch_spec(parse_launch_args(argv, environ))
    except UsageError as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message
        return None


def assert_sane(spec: LaunchSpec) -> None:
    seconds = [spec.monitor_interval, spec.shutdown_timeout, spec.faults.hang_timeout]
    seconds += [spec.rdzv.join_timeout, spec.rdzv.read_timeout, spec.rdzv.heartbeat_timeout]
    seconds += [spec.faults.heartbeat_interval, spec.health.interval]
    assert all(math.isfinite(s) and 0 <= s <= flag_values.MAX_SECONDS for s in seconds), seconds
    if spec.nproc_per_node.isdigit():
        assert 1 <= int(spec.nproc_per_node) <= flag_values.MAX_NPROC
    assert spec.nodes.max_nodes <= flag_values.MAX_NODES
    assert spec.snapshots.memory is None or 0 < spec.snapshots.memory <= flag_values.MAX_SIZE
    assert 0 <= spec.rdzv.port < 65536 and spec.max_restarts < flag_values.MAX_COUNT


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_any_command_line_gives_a_sane_spec_or_one_usage_line(argv):
    spec = spec_or_usage_error(argv, {})
    if spec is not None:
        assert_sane(spec)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([s.env for s in SETTINGS if not s.switch]),
        VALUES,
        max_size=3,
    )
)
def test_any_pet_environment_gives_a_sane_spec_or_one_usage_line(environ):
    spec = spec_or_usage_error([PROBE], environ)
    if spec is not None:
        assert_sane(spec)


SLURM_VARS = [
    "SLURM_JOB_ID",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_GPUS_ON_NODE",
    "SLURM_RESTART_COUNT",
]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(SLURM_VARS), VALUES, max_size=5),
    st.one_of(
        st.sampled_from(["n[0-3]", "n[0-99999][0-99999]", "n[1-", "a,b", "n[\u0661-3]"]),
        st.text(max_size=12),
    ),
)
def test_any_slurm_environment_gives_a_job_or_one_usage_line(environ, nodelist):
    environ = {"SLURM_JOB_ID": "1", **environ, "SLURM_JOB_NODELIST": nodelist}
    try:
        job = read_slurm_job(environ)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert job is not None and 1 <= len(job.nodes) <= 65536 and 0 <= job.node_id < len(job.nodes)
