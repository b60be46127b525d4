"""Slurm: hostlist expressions, the SLURM_* environment, and the flags it stands for."""

from __future__ import annotations

import pytest

from rtrain.core.config.slurm.env import SlurmJob, apply_slurm, read_slurm_job
from rtrain.core.config.slurm.hostlist import HostlistError, expand_hostlist
from rtrain.core.errors import UsageError


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[01-04,07]", ["n01", "n02", "n03", "n04", "n07"]),
        ("rack[0-1]_n[1-2]", ["rack0_n1", "rack0_n2", "rack1_n1", "rack1_n2"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("gpu[008-011]", ["gpu008", "gpu009", "gpu010", "gpu011"]),
        ("x[9-10]", ["x9", "x10"]),
        ("n[1-2],m[3]", ["n1", "n2", "m3"]),
        (" n[1, 3] ", ["n1", "n3"]),
    ],
)
def test_hostlists_expand(expression, hosts) -> None:
    assert expand_hostlist(expression) == hosts


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty node list"),
        ("n[1-", "unclosed '['"),
        ("n1]", "unmatched ']'"),
        ("n[[1]]", "nested '['"),
        ("n[]", "empty brackets"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "not a number or a range"),
        ("n[1-2-3]", "not a number or a range"),
        ("a,,b", "empty host name"),
        ("n[0-99999999]", "too large"),
    ],
)
def test_malformed_hostlists_say_where(expression, fragment) -> None:
    with pytest.raises(HostlistError) as caught:
        expand_hostlist(expression)
    assert fragment in str(caught.value)


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "n[1-3]",
    "SLURM_NNODES": "3",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "n2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
}


def test_a_slurm_step_is_read_whole() -> None:
    job = read_slurm_job({**SLURM, "SLURM_GPUS_ON_NODE": "8", "SLURM_RESTART_COUNT": "2"})
    assert job == SlurmJob(4242, ("n1", "n2", "n3"), 1, 8, 2)
    assert job.head == "n1" and job.port == 24242
    assert read_slurm_job({}) is None
    assert read_slurm_job({**SLURM, "RTRAIN_NO_SLURM": "1"}) is None
    step = read_slurm_job(
        {
            **SLURM,
            "SLURM_STEP_NODELIST": "n[2-3]",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_NODEID": "0",
            "SLURMD_NODENAME": "n2",
        }
    )
    assert step is not None and step.nodes == ("n2", "n3")


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not a job id"),
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is missing or empty"),
        ({"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST='n[1-': unclosed"),
        ({"SLURM_NNODES": "2"}, "SLURM_NNODES=2 but SLURM_JOB_NODELIST='n[1-3]' names 3 nodes"),
        ({"SLURM_NNODES": "two"}, "SLURM_NNODES='two' is not a node count"),
        ({"SLURM_NODEID": "5"}, "SLURM_NODEID=5 but"),
        ({"SLURMD_NODENAME": "n3"}, "SLURMD_NODENAME=n3 but SLURM_NODEID=1 is n2"),
        ({"SLURM_STEP_TASKS_PER_NODE": "8(x3)"}, "runs one task per node"),
        ({"SLURM_GPUS_ON_NODE": "lots"}, "SLURM_GPUS_ON_NODE='lots'"),
        ({"SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT='-1'"),
    ],
)
def test_contradictions_and_garbage_name_the_variable(changes, fragment) -> None:
    with pytest.raises(UsageError) as caught:
        read_slurm_job({**SLURM, **changes})
    assert fragment in str(caught.value) and caught.value.exit_code == 64


def test_slurm_fills_only_the_flags_not_given() -> None:
    job = SlurmJob(7, ("n1", "n2"), 0, 4, 0)
    addresses = {"n1": "10.0.0.1"}
    raw, took = apply_slurm({"rdzv_conf": "join_timeout=60"}, set(), job, addresses)
    assert raw["rdzv_backend"] == "c10d" and raw["rdzv_endpoint"] == "10.0.0.1:20007"
    assert raw["rdzv_id"] == "7" and raw["nnodes"] == "1:2" and raw["nproc_per_node"] == "4"
    assert raw["rdzv_conf"] == "join_timeout=60,is_host=true" and raw["local_addr"] == "10.0.0.1"
    assert any("2 nodes (n1,n2)" in t for t in took)
    mine = {"nnodes": "2", "nproc_per_node": "2", "rdzv_endpoint": "head:1234", "local_addr": "me"}
    raw, took = apply_slurm(dict(mine), set(mine), SlurmJob(7, ("n1", "n2"), 1, 4, 0), {})
    assert {k: raw[k] for k in mine} == mine  # explicit flags win
    assert "rdzv_id" not in raw and "rendezvous from the flags" in took
    single, _ = apply_slurm({}, set(), SlurmJob(8, ("n1",), 0, None, 0), {})
    assert single["nnodes"] == "1" and "nproc_per_node" not in single
