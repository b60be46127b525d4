"""rtrain launch end to end: real workers over gloo, real torchrun as the oracle."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.helpers import (
    PROBE,
    RTRAIN,
    HeldPort,
    events_under,
    probe_env,
    records,
    run,
    run_torchrun,
)

pytestmark = pytest.mark.integration

# Values that differ between any two runs, whoever launches them (PROBE_OUT: the test's).
NONDETERMINISTIC = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "PROBE_OUT"}


def _worker_envs(
    tmp_path, name: str, launcher: list[str] | None, flags: list[str]
) -> dict[int, dict[str, str]]:
    """The workers' environments under rtrain (launcher) or torchrun (None)."""
    out = tmp_path / name
    args = [*flags, PROBE, "--lr", "0.1"]
    env = probe_env(out)
    result = run([*launcher, *args], env) if launcher else run_torchrun(args, env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = records(out)
    assert sorted(found) == [(0, 0), (0, 1)]
    for record in found.values():
        assert record["argv"] == [PROBE, "--lr", "0.1"]
        assert "--local-rank" not in " ".join(record["argv"])
    return {rank: found[(0, rank)]["env"] for (_, rank) in found}


@pytest.mark.parametrize(
    "flags",
    [
        ["--standalone", "--nproc-per-node=2"],
        ["--nnodes=1", "--nproc_per_node=2", "--master-addr=127.0.0.1", "--master-port={port}"],
    ],
    ids=["standalone", "static"],
)
def test_worker_environment_matches_torchrun(tmp_path, flags):
    # static: the launcher binds --master-port and hands the number to its workers as
    # MASTER_PORT, so a port 0 will not do; held until the launcher is done (HeldPort)
    with HeldPort() as held:
        theirs = _worker_envs(tmp_path, "torchrun", None, [f.format(port=held.port) for f in flags])
    with HeldPort() as held:
        ours = _worker_envs(tmp_path, "rtrain", RTRAIN, [f.format(port=held.port) for f in flags])
    for rank in (0, 1):
        ours_torch_keys = {k: v for k, v in ours[rank].items() if not k.startswith("RTRAIN_")}
        assert set(ours_torch_keys) == set(theirs[rank]), set(ours_torch_keys) ^ set(theirs[rank])
        for key, value in theirs[rank].items():
            if key not in NONDETERMINISTIC:
                assert ours_torch_keys[key] == value, key
        assert ours[rank]["RTRAIN_GENERATION"] == "0"
        assert ours[rank]["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
    assert ours[0]["OMP_NUM_THREADS"] == "1"


def test_two_nodes_on_localhost(tmp_path):
    with HeldPort() as held:  # node 0 binds it; node 1 is told it before that
        common = [
            "--nnodes=2",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{held.port}",
        ]
        env = probe_env(tmp_path, PROBE_STEPS="5")
        nodes = [
            subprocess.Popen(
                [*RTRAIN, *common, f"--local-addr={addr}", "--rdzv-id=two", PROBE],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for addr in ("127.0.0.1", "127.0.0.2")
        ]
        outputs = [node.communicate(timeout=90) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    found = records(tmp_path)
    assert sorted(found) == [(0, r) for r in range(4)]
    group_ranks = sorted(int(rec["env"]["GROUP_RANK"]) for rec in found.values())
    assert group_ranks == [0, 0, 1, 1]
    for rec in found.values():
        assert rec["env"]["WORLD_SIZE"] == "4" and rec["env"]["GROUP_WORLD_SIZE"] == "2"
        assert rec["first_sum"] == 4.0 and rec["steps"] == 5
    # Every worker meets at node 0's worker store, whichever address node 0 has.
    assert len({rec["env"]["MASTER_ADDR"] for rec in found.values()}) == 1
    assert found[(0, 0)]["env"]["MASTER_ADDR"] in ("127.0.0.1", "127.0.0.2")


def test_module_and_no_python_entry_points(tmp_path):
    (tmp_path / "probe_pkg").mkdir()
    (tmp_path / "probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "probe_pkg" / "hello.py").write_text(
        "import os, sys\nprint('module', os.environ['RANK'], sys.argv[1:])\n"
    )
    env = probe_env(tmp_path, PYTHONPATH=str(tmp_path))
    result = run([*RTRAIN, "--nproc-per-node=2", "-m", "probe_pkg.hello", "x"], env)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split("\n"))[-2:] == ["module 0 ['x']", "module 1 ['x']"]
    result = run([*RTRAIN, "--nproc-per-node=2", "--no-python", "sh", "-c", "echo rank=$RANK"], env)
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.split("\n") if line) == ["rank=0", "rank=1"]


def test_example_trains_to_the_same_weights_as_under_torchrun(tmp_path):
    script = ["examples/train_mlp.py", "--steps", "60"]
    flags = ["--standalone", "--nproc-per-node=2"]
    ours = run([*RTRAIN, *flags, *script], probe_env(tmp_path))
    theirs = run_torchrun([*flags, *script], probe_env(tmp_path))
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr

    def checksum(stdout: str) -> str:
        return stdout.strip().splitlines()[-1].rsplit(" ", 1)[-1]

    assert checksum(ours.stdout) == checksum(theirs.stdout)
    # The README's first command: rtrain's own lines and the script's, no stray warnings.
    assert [line for line in ours.stderr.splitlines() if "Warning" in line] == []


def _two_node_job(tmp_path, *extra: str, **env_extra: str) -> list[subprocess.CompletedProcess]:
    with HeldPort() as held:  # node 0 binds it; node 1 is told it before that
        env = probe_env(tmp_path, **env_extra)
        procs = [
            subprocess.Popen(
                [
                    *RTRAIN,
                    "--nnodes=2",
                    "--nproc-per-node=2",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{held.port}",
                    f"--local-addr={addr}",
                    *extra,
                    PROBE,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for addr in ("127.0.0.1", "127.0.0.2")
        ]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_a_failure_on_one_node_restarts_every_node(tmp_path):
    results = _two_node_job(
        tmp_path, "--max-restarts=1", PROBE_FAULT="rank=3,step=1,gen=0,action=exit", PROBE_STEPS="4"
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    found = records(tmp_path)
    assert found[(0, 3)]["fault"] == "exit"
    for rank in range(4):
        assert found[(1, rank)]["steps"] == 4
        assert found[(1, rank)]["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
    # only the node whose worker failed spent a restart
    spent = [r for r in results if "restarts used" in r.stderr]
    assert len(spent) == 1


def test_every_node_stops_when_restarts_are_exhausted(tmp_path):
    logs = tmp_path / "logs"
    results = _two_node_job(
        tmp_path, f"--log-dir={logs}", PROBE_FAULT="rank=2,step=0,gen=0,action=raise"
    )
    assert [r.returncode for r in results] == [1, 1], results[0].stderr[-3000:]
    # Asserted on the structured events, which each agent writes before it exits
    # (the other node's failure table may be read before the failing node wrote it).
    ends = events_under(logs, "job_end")
    assert sorted(e.agent for e in ends) == ["127.0.0.1", "127.0.0.2"]
    for end in ends:
        assert end["exit_code"] == 1
        assert "max_restarts=0 exhausted" in end["message"]
    faults = [e for e in events_under(logs, "fault") if not e.get("victim")]
    assert [(e["rank"], e["kind"]) for e in faults] == [(2, "exit")], faults
    assert "RuntimeError: injected failure at step 0" in faults[0]["message"]
    assert "RuntimeError: injected failure at step 0" in results[1].stderr


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from rtrain.cli.launch_args import launch_help\n"
        "import rtrain.cli.main\n"
        "launch_help({})\n"
        "assert 'torch' not in sys.modules, 'help imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for argv in (["--help"], ["launch", "--help"]):
        result = subprocess.run(
            [sys.executable, "-m", "rtrain.cli.main", *argv], capture_output=True, text=True
        )
        assert result.returncode == 0 and "rtrain" in result.stdout
