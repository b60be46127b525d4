"""rtrain under a real Slurm cluster on this machine (scripts/slurm_cluster.sh: munged,
slurmctld and two slurmd as virtual nodes n1, n2). Skipped where Slurm is not installed;
CI installs it (.ci/run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rtrain.core.config.slurm.hostlist import expand_hostlist
from tests.integration.cluster import RESUMABLE, SNAPSHOTTING, STEPS, assert_same_weights
from tests.integration.helpers import ROOT, RTRAIN, probe_env, records

pytestmark = pytest.mark.slurm
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"
SLURM_DIR = os.environ.get("RTRAIN_SLURM_DIR", "/tmp/rtrain-slurm")
FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


@pytest.fixture(scope="session")
def slurm() -> Iterator[dict[str, str]]:
    """The environment for Slurm commands; starts the cluster unless it runs already."""
    if shutil.which("slurmctld") is None or shutil.which("srun") is None:
        pytest.skip("Slurm is not installed here (.ci/run installs slurmctld slurmd munge)")
    env = {**os.environ, "SLURM_CONF": f"{SLURM_DIR}/slurm.conf"}
    running = subprocess.run(["sinfo", "-h"], env=env, capture_output=True).returncode == 0
    if not running and os.geteuid() != 0:
        pytest.skip("no Slurm cluster running: sudo scripts/slurm_cluster.sh start")
    if not running:
        started = subprocess.run([str(CLUSTER), "start", "2"], capture_output=True, text=True)
        assert started.returncode == 0, started.stdout + started.stderr
    yield env
    if not running:
        subprocess.run([str(CLUSTER), "stop"], capture_output=True)


def job_env(slurm: dict[str, str], out: Path, **extra: str) -> dict[str, str]:
    env = probe_env(out, **extra)
    env = {k: v for k, v in env.items() if not k.startswith("SLURM") or k == "SLURM_CONF"}
    # As a batch script would: a job secret exported to every task (README, Security).
    secret = {"RTRAIN_SECRET": "slurm-test-job-secret"}
    return {**env, **secret, "SLURM_CONF": slurm["SLURM_CONF"], "PYTHONUNBUFFERED": "1"}


def srun(slurm: dict[str, str], *args: str) -> list[str]:
    return ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", *args]


def agents_on(node: str, out: Path) -> list[psutil.Process]:
    """The rtrain agents of this test (PROBE_OUT=out) on Slurm node `node`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "rtrain.cli.main" not in " ".join(proc.info["cmdline"] or []):
                continue
            env = proc.environ()
            if env.get("SLURMD_NODENAME") == node and env.get("PROBE_OUT") == str(out):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def progress(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def wait_for(check, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "expression",
    ["n[01-04,07]", "rack[0-1]_n[1-2]", "a,b[1-2],c", "gpu[008-011]", "x[9-10]y[1,3]", "solo"],
)
def test_hostlists_expand_like_scontrol(slurm, expression) -> None:
    done = subprocess.run(
        ["scontrol", "show", "hostnames", expression], env=slurm, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert expand_hostlist(expression) == done.stdout.split()


def test_srun_two_nodes_trains_to_the_end(slurm, tmp_path, reference) -> None:
    out = tmp_path / "out"
    env = job_env(slurm, out, PROBE_STEPS=STEPS, PROBE_CKPT=str(tmp_path / "ckpt.pt"))
    cmd = srun(slurm, f"--output={tmp_path}/task%t.log", *RTRAIN, "--nproc-per-node=2", RESUMABLE)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    logs = {n: (tmp_path / f"task{i}.log").read_text() for i, n in enumerate(("n1", "n2"))}
    assert done.returncode == 0, done.stderr + str(logs)
    final = records(out)
    assert sorted(rank for _, rank in final) == [0, 1, 2, 3]
    for rec in final.values():
        assert rec["world_size"] == 4 and rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)
    first = logs["n1"].splitlines()[0]
    assert "Slurm job" in first and "2 nodes (n1,n2)" in first and "this node rank 0" in first


def test_a_node_killed_with_no_kill_the_other_finishes(slurm, tmp_path, reference) -> None:
    out = tmp_path / "out"
    env = job_env(
        slurm, out, PROBE_STEPS=STEPS, PROBE_STEP_SLEEP="0.1", PROBE_CKPT=str(tmp_path / "ck.pt")
    )
    cmd = srun(
        slurm,
        "--no-kill",
        f"--output={tmp_path}/task%t.log",
        *RTRAIN,
        "--nproc-per-node=2",
        *FAST,
        RESUMABLE,
    )
    job = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: progress(out) >= 5, 90, "step 5")
        (agent,) = agents_on("n2", out)
        victims = [agent, *agent.children(recursive=True)]
        for proc in victims:  # the whole node: agent, pool and workers
            proc.send_signal(signal.SIGKILL)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    survivor = (tmp_path / "task0.log").read_text()  # task 0 runs on n1
    assert "lost: its lease was not renewed" in survivor, survivor
    found = records(out)
    last = max(gen for gen, _ in found)
    final = {rank: rec for (gen, rank), rec in found.items() if gen == last}
    assert sorted(final) == [0, 1]
    for rec in final.values():
        assert rec["world_size"] == 2 and rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)


EXAMPLE = ROOT / "examples" / "slurm" / "train.sbatch"
SNAPSHOT_STEPS = "60"


def job_state(slurm: dict[str, str], job_id: str) -> dict[str, str]:
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=slurm, capture_output=True, text=True
    )
    fields = (f.split("=", 1) for f in done.stdout.split() if "=" in f)
    return {key: value for key, value in fields}


@pytest.fixture(scope="module")
def snapshot_digest(tmp_path_factory) -> str:
    """train_snapshot.py's final state with 4 workers and no fault."""
    tmp = tmp_path_factory.mktemp("snapshot_reference")
    env = probe_env(tmp / "out", PROBE_STEPS=SNAPSHOT_STEPS, PROBE_STEP_SLEEP="0")
    done = subprocess.run(
        [*RTRAIN, "--standalone", "--nproc-per-node=4", SNAPSHOTTING],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    digests = {json.loads(p.read_text())["digest"] for p in (tmp / "out").glob("final_rank*.json")}
    assert len(digests) == 1
    return digests.pop()


def test_usr1_saves_exits_75_and_the_requeued_job_resumes(slurm, tmp_path, snapshot_digest):
    """The example batch script end to end: Slurm's warning signal before the time limit
    makes every agent save its workers' newest snapshot and exit 75; the script requeues
    the job, which restores from the checkpoint and ends with the state of a run that
    was never stopped."""
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    env = job_env(
        slurm,
        out,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.15",
        SCRIPT=SNAPSHOTTING,
        CHECKPOINTS=str(checkpoints),
        RTRAIN_FLAGS=" ".join(["--nproc-per-node=2", *FAST]),
    )
    submit = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--gpus-per-node=0",
            f"--output={tmp_path}/job.log",
            f"--chdir={ROOT}",
            str(EXAMPLE),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: progress(out) >= 8, 120, "step 8")
        signalled = subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm)
        assert signalled.returncode == 0
        wait_for(lambda: job_state(slurm, job_id).get("Restarts") == "1", 60, "the requeue")
        wait_for(lambda: job_state(slurm, job_id).get("JobState") == "COMPLETED", 240, "the end")
    finally:
        subprocess.run(["scancel", job_id], env=slurm, capture_output=True)
    log = (tmp_path / "job.log").read_text()
    assert "received SIGUSR1 from Slurm; saved step" in log, log
    assert "rtrain exited 75: requeueing" in log and "requeued 1 time(s)" in log, log
    assert "from the disk checkpoint in" in log, log
    finals = [json.loads(p.read_text()) for p in out.glob("final_rank*.json")]
    assert len(finals) == 4 and {f["digest"] for f in finals} == {snapshot_digest}, log


def test_drain_on_fault_drains_the_node_with_the_failed_check(slurm, tmp_path, reference):
    """n2's (fake) GPU asks for a reboot: its agent stays out and drains n2 in Slurm, with
    the finding as the reason; n1 trains alone to the same weights."""
    out = tmp_path / "out"
    for node, gpu0 in (("n1", {}), ("n2", {"readings": {"recovery_action": 2}})):
        gpus = [{"uuid": f"GPU-{node}-0", **gpu0}, {"uuid": f"GPU-{node}-1"}]
        (tmp_path / f"{node}.json").write_text(json.dumps({"gpus": gpus}))
    env = job_env(slurm, out, PROBE_STEPS=STEPS, PROBE_CKPT=str(tmp_path / "ckpt.pt"))
    launch = " ".join(
        [
            *RTRAIN,
            "--nproc-per-node=2",
            "--drain-on-fault",
            "--health-interval=1",
            "--rdzv-conf=last_call_timeout=2",
            RESUMABLE,
        ]
    )
    wrapped = f"RTRAIN_FAKE_NVML={tmp_path}/$SLURMD_NODENAME.json exec {launch}"
    cmd = srun(slurm, "--no-kill", f"--output={tmp_path}/task%t.log", "bash", "-c", wrapped)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%T|%E"], env=slurm, capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], env=slurm)
    sick = (tmp_path / "task1.log").read_text()
    assert done.returncode == 77, done.stderr + sick
    assert "drained Slurm node n2" in sick
    state = dict(line.split("|", 1) for line in nodes.split("\n") if line)
    assert state["n2"].startswith("drain"), nodes
    assert "rtrain: GPU 0 (GPU-n2-0): recovery_action: driver asks for: node reboot" in nodes
    final = records(out)
    assert {rec["world_size"] for rec in final.values()} == {2}
    for rec in final.values():
        assert rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)
